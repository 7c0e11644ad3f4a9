//! h5i-broker: the host side of every box.
//!
//! Owns the append-only receipt log, secret resolution and redaction, and (as the tiers that need
//! them arrive) the egress and credential proxies. Must never: hand a secret value to a box other
//! than through the one run that declared it, write a secret value to disk, or rewrite a record
//! already in the log.

pub mod receipt_log;
pub mod redact;
pub mod secrets;
