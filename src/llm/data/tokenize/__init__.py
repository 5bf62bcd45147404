"""Tokenizers: `simple` bytes, tokenizer.json, `.tiktoken`, and the identity-checked engines that encode them."""
