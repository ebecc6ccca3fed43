"""The race: baseline against speculative decoding on the same prompt."""
