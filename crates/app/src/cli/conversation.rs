//! `parlance conversation ...`: the operator's commands, talking to a
//! running server over its HTTP API.

use std::io::Write;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};
use url::Url;

/// Where the server is and which key to use.
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// The server's base URL.
    #[arg(long, env = "PARLANCE_SERVER", default_value = "http://127.0.0.1:8080")]
    pub server: String,
    /// The API key (as printed by `parlance serve`).
    #[arg(long, env = "PARLANCE_API_KEY", hide_env_values = true)]
    pub api_key: String,
    /// The product the key opens.
    #[arg(long, default_value = "default")]
    pub product: String,
}

/// Operator commands on conversations.
#[derive(Debug, Clone, Subcommand)]
pub enum ConversationCommand {
    /// Start a conversation (queued if the contact already has one).
    Create {
        /// Who to talk to.
        #[arg(long)]
        contact: String,
        /// What the agent must achieve.
        #[arg(long)]
        objective: String,
        /// Checklist items, comma-separated.
        #[arg(long, value_delimiter = ',')]
        todos: Vec<String>,
        /// Follow-up interval: seconds, or a duration such as `90s`, `30m`,
        /// `2h`, `1d`, `1h 30m`.
        #[arg(long, value_parser = parse_duration_s)]
        heartbeat: Option<u64>,
        /// Follow-ups before the conversation is abandoned.
        #[arg(long = "max-followups")]
        max_follow_ups: Option<u32>,
        /// The channel name.
        #[arg(long)]
        channel: Option<String>,
    },
    /// List conversations.
    List {
        /// Only this contact's.
        #[arg(long)]
        contact: Option<String>,
        /// Only in this state (e.g. `WAITING_FOR_REPLY`).
        #[arg(long)]
        state: Option<String>,
    },
    /// Show one conversation.
    Get {
        /// The conversation id.
        id: String,
    },
    /// Print the transcript.
    Transcript {
        /// The conversation id.
        id: String,
    },
    /// Suspend a conversation.
    Pause {
        /// The conversation id.
        id: String,
    },
    /// Resume a paused conversation, or hand one back to the agent.
    Resume {
        /// The conversation id.
        id: String,
    },
    /// Cancel a conversation (no farewell message).
    Cancel {
        /// The conversation id.
        id: String,
    },
    /// Send a message as the operator.
    Send {
        /// The conversation id.
        id: String,
        /// The text.
        text: String,
    },
}

/// Parses a `--heartbeat` interval: plain seconds (`45`) or a duration in
/// humantime's syntax (`90s`, `30m`, `2h`, `1d`, `1h 30m`, `2days`, `1w`), a
/// whole number of seconds, at least one.
///
/// # Errors
///
/// Anything else, zero, or a fraction of a second.
pub(super) fn parse_duration_s(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let duration = if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        let secs = s.parse().map_err(|_| format!("duration too long: {s:?}"))?;
        Duration::from_secs(secs)
    } else {
        humantime::parse_duration(s).map_err(|e| format!("not a duration: {s:?} ({e})"))?
    };
    if duration.subsec_nanos() != 0 {
        return Err(format!("{s:?} is not a whole number of seconds"));
    }
    match duration.as_secs() {
        0 => Err("the interval must be at least 1 second".to_owned()),
        secs => Ok(secs),
    }
}

/// The URL of `segments` under the product's API on the server; each
/// segment is percent-encoded whole (a `/`, `?` or `#` in an id stays in
/// its segment).
fn endpoint(client: &ClientArgs, segments: &[&str]) -> anyhow::Result<Url> {
    let mut url = Url::parse(&client.server)
        .with_context(|| format!("--server {:?} is not a URL", client.server))?;
    for segment in std::iter::once(client.product.as_str()).chain(segments.iter().copied()) {
        // `.` and `..` would be resolved away rather than sent.
        if matches!(segment, "" | "." | "..") {
            bail!("{segment:?} is not a usable id");
        }
    }
    url.path_segments_mut()
        .map_err(|()| anyhow::anyhow!("--server {:?} cannot take a path", client.server))?
        .pop_if_empty()
        .extend(["v1", "products", &client.product])
        .extend(segments);
    Ok(url)
}

/// Runs one command against the server and prints its answer to `out`.
///
/// # Errors
///
/// When the server cannot be reached or answers with an error.
pub(super) async fn run(
    client: ClientArgs,
    command: ConversationCommand,
    mut out: impl Write,
) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let (method, url, body) = match &command {
        ConversationCommand::Create {
            contact,
            objective,
            todos,
            heartbeat,
            max_follow_ups,
            channel,
        } => {
            let mut body = json!({"contact_id": contact, "objective": objective, "todos": todos});
            if let Some(h) = heartbeat {
                body["heartbeat_interval_s"] = json!(h);
            }
            if let Some(m) = max_follow_ups {
                body["max_follow_ups"] = json!(m);
            }
            if let Some(c) = channel {
                body["channel"] = json!(c);
            }
            (
                reqwest::Method::POST,
                endpoint(&client, &["conversations"])?,
                Some(body),
            )
        }
        ConversationCommand::List { contact, state } => {
            let mut url = endpoint(&client, &["conversations"])?;
            let filters = [("contact_id", contact), ("state", state)];
            if filters.iter().any(|(_, v)| v.is_some()) {
                let mut query = url.query_pairs_mut();
                for (name, value) in filters {
                    if let Some(v) = value {
                        query.append_pair(name, v);
                    }
                }
            }
            (reqwest::Method::GET, url, None)
        }
        ConversationCommand::Get { id } | ConversationCommand::Transcript { id } => (
            reqwest::Method::GET,
            endpoint(&client, &["conversations", id])?,
            None,
        ),
        ConversationCommand::Pause { id } => (
            reqwest::Method::POST,
            endpoint(&client, &["conversations", id, "pause"])?,
            None,
        ),
        ConversationCommand::Resume { id } => (
            reqwest::Method::POST,
            endpoint(&client, &["conversations", id, "resume"])?,
            None,
        ),
        ConversationCommand::Cancel { id } => (
            reqwest::Method::POST,
            endpoint(&client, &["conversations", id, "cancel"])?,
            None,
        ),
        ConversationCommand::Send { id, text } => (
            reqwest::Method::POST,
            endpoint(&client, &["conversations", id, "send"])?,
            Some(json!({"text": text})),
        ),
    };
    let mut request = http.request(method, url).bearer_auth(&client.api_key);
    if let Some(b) = &body {
        request = request.json(b);
    }
    let response = request
        .send()
        .await
        .with_context(|| format!("cannot reach {}", client.server))?;
    let status = response.status();
    let answer: Value = response.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        let detail = answer
            .get("detail")
            .and_then(Value::as_str)
            .unwrap_or("no detail");
        bail!("server answered {status}: {detail}");
    }
    if let ConversationCommand::Transcript { .. } = command {
        for m in answer["transcript"].as_array().into_iter().flatten() {
            writeln!(
                out,
                "{}: {}",
                m["role"].as_str().unwrap_or("?"),
                m["text"].as_str().unwrap_or("")
            )?;
        }
    } else {
        writeln!(out, "{}", serde_json::to_string_pretty(&answer)?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration_s("30m"), Ok(1800));
        assert_eq!(parse_duration_s("90s"), Ok(90));
        assert_eq!(parse_duration_s("2h"), Ok(7200));
        assert_eq!(parse_duration_s("1d"), Ok(86_400));
        assert_eq!(parse_duration_s("45"), Ok(45));
        assert_eq!(parse_duration_s(" 45 "), Ok(45));
        // What humantime adds to the units above.
        assert_eq!(parse_duration_s("1h 30m"), Ok(5400));
        assert_eq!(parse_duration_s("2days"), Ok(172_800));
        assert_eq!(parse_duration_s("5w"), Ok(3_024_000));
        assert!(parse_duration_s("0").is_err());
        assert!(parse_duration_s("0s").is_err());
        assert!(parse_duration_s("1500ms").is_err());
        assert!(parse_duration_s("5x").is_err());
        assert!(parse_duration_s("m").is_err());
        assert!(parse_duration_s("").is_err());
        assert!(parse_duration_s("-5").is_err());
        assert!(parse_duration_s("99999999999999999999999").is_err());
    }

    fn client(server: &str, product: &str) -> ClientArgs {
        ClientArgs {
            server: server.to_owned(),
            api_key: "k".to_owned(),
            product: product.to_owned(),
        }
    }

    #[test]
    fn components_are_encoded() {
        let id = "+56 9/x?y#z%20é";
        let url = endpoint(
            &client("http://127.0.0.1:8080", "ac me"),
            &["conversations", id, "pause"],
        )
        .unwrap();
        assert_eq!(
            url.as_str(),
            "http://127.0.0.1:8080/v1/products/ac%20me/conversations/\
             +56%209%2Fx%3Fy%23z%2520%C3%A9/pause"
        );
        assert!(url.query().is_none() && url.fragment().is_none());
        let segments: Vec<String> = url.path_segments().unwrap().map(percent_decode).collect();
        assert_eq!(
            segments,
            ["v1", "products", "ac me", "conversations", id, "pause"]
        );
    }

    #[test]
    fn a_server_with_a_path_keeps_it() {
        for server in ["http://h:1/api", "http://h:1/api/"] {
            let url = endpoint(&client(server, "acme"), &["conversations"]).unwrap();
            assert_eq!(
                url.as_str(),
                "http://h:1/api/v1/products/acme/conversations"
            );
        }
    }

    #[test]
    fn dot_segments_and_bad_servers_are_refused() {
        let c = client("http://h:1", "acme");
        for id in ["", ".", ".."] {
            assert!(endpoint(&c, &["conversations", id]).is_err(), "{id:?}");
        }
        assert!(endpoint(&client("not a url", "acme"), &["conversations"]).is_err());
        assert!(endpoint(&client("mailto:a@b", "acme"), &["conversations"]).is_err());
    }

    /// Percent-decodes a path segment (form decoding, with `+` kept).
    fn percent_decode(s: &str) -> String {
        url::form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
            .next()
            .unwrap()
            .1
            .into_owned()
    }
}
