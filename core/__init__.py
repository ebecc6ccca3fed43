"""SpecLens engine: lossless speculative decoding with chains and token trees. Never imports Qt."""
