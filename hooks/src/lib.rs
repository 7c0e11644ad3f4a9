//! h5i-hook: what happens at a box's edges in time.
//!
//! Owns ingesting what a box staged in its spool (validated, then recorded as box-claimed) and,
//! as the kernel tiers arrive, the OCI hooks that wire and tear down a box's network. Must never:
//! trust a spool entry's claimed lane, follow a symlink out of the spool, or write a record as
//! host-observed.
