//! Session snapshots and tour catalogs: decoding any bytes never panics,
//! decoding the text and decoding its parsed value agree, and whatever
//! decodes survives a round trip through its own snapshot, as a value and as
//! text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use parlance_core::session::{SessionState, TourCatalog};

fuzz_target!(|data: &[u8]| {
    let decoded = SessionState::from_snapshot_slice(data);
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
        assert_eq!(SessionState::from_snapshot(&v), decoded, "text and value agree");
    }
    if let Ok(state) = decoded {
        let again = SessionState::from_snapshot(&state.to_snapshot())
            .expect("a snapshot the decoder wrote decodes");
        assert_eq!(again, state);
        let text = state.to_snapshot_string();
        let again = SessionState::from_snapshot_slice(text.as_bytes())
            .expect("snapshot text the encoder wrote decodes");
        assert_eq!(again, state);
    }
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data)
        && let Ok(catalog) = TourCatalog::from_value(&v)
    {
        TourCatalog::from_value(&catalog.to_value()).expect("a catalog it wrote decodes");
    }
});
