//! Integration tests of parlance-core: the recorded reference conformance cases.

mod adoption_conformance;
mod id_patterns;
mod session_conformance;
