//! Session snapshots and tour catalogs: decoding any bytes never panics, and
//! whatever decodes survives a round trip through its own snapshot.
#![no_main]

use libfuzzer_sys::fuzz_target;
use parlance_core::session::{SessionState, TourCatalog};

fuzz_target!(|data: &[u8]| {
    if let Ok(state) = SessionState::from_snapshot_slice(data) {
        let again = SessionState::from_snapshot(&state.to_snapshot())
            .expect("a snapshot the decoder wrote decodes");
        assert_eq!(again, state);
    }
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data)
        && let Ok(catalog) = TourCatalog::from_value(&v)
    {
        TourCatalog::from_value(&catalog.to_value()).expect("a catalog it wrote decodes");
    }
});
