//! What each op is, independent of the backend that runs it: its options, epilogues and shape rules.
//! Both backends read these definitions: the WGSL launchers in [`crate::ops`] and the CPU backend's
//! twins in [`crate::cpu::host`]. Nothing here runs an op. The layering is
//! `gpu` (device, tensors) < `opdef` < `cpu` < `ops` < `model`, so neither backend imports the other's
//! options.

pub mod attention;
pub(crate) mod check;
pub mod conv;
pub mod linear;
