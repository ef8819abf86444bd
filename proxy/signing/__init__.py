"""The context signer: intent, coarse tags, the encoding view and its vectors."""
