"""`speclens serve`: the engine behind OpenAI's HTTP API, with Predicted Outputs (core.serve.cli)."""
