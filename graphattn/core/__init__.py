"""The core: edge sets (explicit and structured), the attention layer, its dispatch and the
producer contract. Everything else in graphattn builds on these modules; they import nothing
above them (no producer, model, runner or viewer)."""
