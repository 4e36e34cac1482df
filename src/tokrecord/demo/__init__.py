"""The embedded demo model: a tiny deterministic Llama that tokrecord builds itself."""
