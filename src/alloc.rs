//! Allocator policies: PyTorch's device caching allocator and host caching allocator.
