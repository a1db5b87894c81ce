//! Supervisor (in progress).
