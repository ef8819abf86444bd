"""Pure text functions: normalisation, numbers, entities, phrases, lexical guards."""
