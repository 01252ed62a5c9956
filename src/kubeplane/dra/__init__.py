"""Dynamic resource allocation: CEL device selectors, validation, pools and the structured allocator."""
