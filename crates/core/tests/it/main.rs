//! Integration tests of parlance-core: the recorded reference conformance cases.

mod session_conformance;
