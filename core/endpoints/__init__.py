"""Other engines SpecLens is measured against or talks to: llama.cpp's own server, any OpenAI-compatible endpoint."""
