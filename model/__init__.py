"""setflow's set-diffusion language model: pure PyTorch, imports nothing else of the project."""
