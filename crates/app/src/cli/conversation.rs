//! `parlance conversation ...`: the operator's commands, talking to a
//! running server over its HTTP API.

use std::io::Write;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};

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
        /// Follow-up interval: `30m`, `90s`, `2h` or seconds.
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

/// Parses `30m`, `90s`, `2h`, `1d` or plain seconds.
///
/// # Errors
///
/// Anything else, or zero.
pub(super) fn parse_duration_s(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (number, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = number
        .parse()
        .map_err(|_| format!("not a duration: {s:?}"))?;
    let factor = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("unknown unit {unit:?} (use s, m, h or d)")),
    };
    match n.checked_mul(factor) {
        Some(0) => Err("the interval must be at least 1 second".to_owned()),
        Some(v) => Ok(v),
        None => Err(format!("duration too long: {s:?}")),
    }
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
    let base = format!(
        "{}/v1/products/{}",
        client.server.trim_end_matches('/'),
        client.product
    );
    let http = reqwest::Client::new();
    let (method, path, body) = match &command {
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
                "/conversations".to_owned(),
                Some(body),
            )
        }
        ConversationCommand::List { contact, state } => {
            let mut query = Vec::new();
            if let Some(c) = contact {
                query.push(format!("contact_id={}", urlencode(c)));
            }
            if let Some(s) = state {
                query.push(format!("state={}", urlencode(s)));
            }
            let q = if query.is_empty() {
                String::new()
            } else {
                format!("?{}", query.join("&"))
            };
            (reqwest::Method::GET, format!("/conversations{q}"), None)
        }
        ConversationCommand::Get { id } | ConversationCommand::Transcript { id } => (
            reqwest::Method::GET,
            format!("/conversations/{}", urlencode(id)),
            None,
        ),
        ConversationCommand::Pause { id } => (
            reqwest::Method::POST,
            format!("/conversations/{}/pause", urlencode(id)),
            None,
        ),
        ConversationCommand::Resume { id } => (
            reqwest::Method::POST,
            format!("/conversations/{}/resume", urlencode(id)),
            None,
        ),
        ConversationCommand::Cancel { id } => (
            reqwest::Method::POST,
            format!("/conversations/{}/cancel", urlencode(id)),
            None,
        ),
        ConversationCommand::Send { id, text } => (
            reqwest::Method::POST,
            format!("/conversations/{}/send", urlencode(id)),
            Some(json!({"text": text})),
        ),
    };
    let mut request = http
        .request(method, format!("{base}{path}"))
        .bearer_auth(&client.api_key);
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

/// Percent-encodes a path or query component.
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration_s("30m"), Ok(1800));
        assert_eq!(parse_duration_s("90s"), Ok(90));
        assert_eq!(parse_duration_s("2h"), Ok(7200));
        assert_eq!(parse_duration_s("45"), Ok(45));
        assert!(parse_duration_s("0").is_err());
        assert!(parse_duration_s("5w").is_err());
        assert!(parse_duration_s("m").is_err());
    }

    #[test]
    fn components_are_encoded() {
        assert_eq!(urlencode("+56 9/x"), "%2B56%209%2Fx");
    }
}
