//! The `MirrorFlow` API: spec and status types, their defaults and validation, and the CRD.
//!
//! No client code lives here: the replicator reads the same types from a file, the operator from
//! the apiserver.

pub mod client_properties;
pub mod crd;
pub mod duration;
pub mod reference;
pub mod rules;
pub mod spec;
pub mod status;

pub use duration::SpecDuration;
pub use spec::*;
pub use status::*;
