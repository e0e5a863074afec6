"""OpenAI's Responses API over setflow's sessions, one folder: the routes (routes.py, and the
WebSocket mode, websocket.py), the request (request.py, its ids: ids.py, its input files:
input_files.py) and its mapping onto a job's spec (mapping.py), where a response continues
(chain.py: its own session or a fork), the response object (view.py), the stream (stream.py),
compaction (compaction.py), and what a store-false response leaves (forget.py)."""
