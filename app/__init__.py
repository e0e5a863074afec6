"""Entry points on the top floor: the `setflow` CLI, `serve`, `submit`, the demo, the tour and the
Python client.  Nothing below imports them."""
