//! Integration tests of parlance-core: reference conformance replays.

mod adoption_conformance;
