"""The tuned CUDA caching-allocator settings (no torch import: job rendering uses them)."""

ALLOC_CONF_VAR = "PYTORCH_CUDA_ALLOC_CONF"
TUNED_ALLOC_CONF = "expandable_segments:True,garbage_collection_threshold:0.7,max_split_size_mb:128"
