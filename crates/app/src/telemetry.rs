//! The tracing subscriber: installed once, by the binary, and nowhere else.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber writing to stderr. The filter comes from
/// `RUST_LOG` (default `info`, with sqlx's notices at `warn`): one access
/// line per request, in its request span (request id, method, route,
/// product). Message text and secrets are never logged at info level;
/// adapters log ids and kinds only. Colours only on a terminal, so a log
/// file or a collector gets plain lines.
pub(crate) fn init(format: LogFormat) {
    use std::io::IsTerminal as _;
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Pretty => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    // A second call (tests, the demo inside serve) keeps the first subscriber.
    drop(result);
}
