//! CUDA helpers (allocate IPC-exportable memory, export handles and events); see issue 4.
