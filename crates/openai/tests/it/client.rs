//! The adapter's own behaviour: SSE streaming, retries and back-off,
//! `Retry-After`, malformed bodies, timeouts, authentication, embeddings.

use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use parlance_openai::{ApiSecret, AuthStyle, OpenAiClient, OpenAiConfig, OpenAiEmbedder};
use parlance_ports::{
    ChunkAccumulator, CompletionChunk, CompletionRequest, EmbeddingProvider, FinishReason,
    LlmClient, LlmError, Message, Usage,
};
use parlance_testkit::llm::Scripted;
use serde_json::json;

use crate::fake::{FAKE_MODEL, FakeServer, Step, stream_events};

fn config(server: &FakeServer) -> OpenAiConfig {
    OpenAiConfig::new(server.base_url(), "test-model")
        .with_api_key(ApiSecret::new("sk-test-key"))
        .with_timeout(Duration::from_secs(5))
        .with_retries(3, Duration::from_millis(20), Duration::from_millis(100))
}

fn hello() -> CompletionRequest {
    CompletionRequest::new(vec![Message::user("Hello")])
}

fn answer(text: &str) -> Step {
    Step::Scripted(Scripted::text(text, Usage::new(3, 2)))
}

fn status(code: u16, retry_after: Option<u64>) -> Step {
    Step::Scripted(Scripted::status(code, retry_after.map(Duration::from_secs)))
}

#[tokio::test]
async fn sse_chunks_arrive_as_they_are_sent() {
    let server = FakeServer::start().await;
    let events = stream_events(
        "Hello from the stream",
        &[],
        "stop",
        json!({"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}),
    );
    // The later events come a second after the first: the first words must
    // be readable before then.
    let pieces = events
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            (
                if i == 3 {
                    Duration::from_millis(1000)
                } else {
                    Duration::ZERO
                },
                e,
            )
        })
        .collect();
    server.push(Step::Sse(pieces));
    let client = OpenAiClient::new(config(&server)).unwrap();
    let started = Instant::now();
    let mut stream = client.stream(&hello()).await.unwrap();
    let mut acc = ChunkAccumulator::new();
    let mut first_text_at = None;
    let mut texts = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.unwrap();
        if matches!(chunk, CompletionChunk::Content { .. }) {
            texts += 1;
            first_text_at.get_or_insert_with(|| started.elapsed());
        }
        acc.push(chunk);
    }
    let total = started.elapsed();
    let r = acc.finish();
    assert_eq!(r.content, "Hello from the stream");
    assert_eq!(r.model, FAKE_MODEL);
    assert_eq!(r.finish_reason, FinishReason::Stop);
    assert_eq!(r.usage, Some(Usage::new(4, 4)));
    assert_eq!(texts, 4, "one chunk per word");
    assert!(total >= Duration::from_millis(1000));
    assert!(
        first_text_at.unwrap() < Duration::from_millis(900),
        "{first_text_at:?} of {total:?}"
    );
    let body = &server.bodies()[0];
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"], json!({"include_usage": true}));
}

#[tokio::test]
async fn rate_limit_waits_for_retry_after_then_succeeds() {
    let server = FakeServer::start().await;
    server.push(status(429, Some(1)));
    server.push(answer("after the wait"));
    let client = OpenAiClient::new(config(&server)).unwrap();
    let started = Instant::now();
    let r = client.complete(&hello()).await.unwrap();
    assert_eq!(r.content, "after the wait");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(server.hits(), 2);
}

#[tokio::test]
async fn server_error_then_success_is_retried_with_back_off() {
    let server = FakeServer::start().await;
    server.push(status(500, None));
    server.push(status(503, None));
    server.push(answer("third time lucky"));
    let client = OpenAiClient::new(config(&server)).unwrap();
    let started = Instant::now();
    let r = client.complete(&hello()).await.unwrap();
    assert_eq!(r.content, "third time lucky");
    assert_eq!(server.hits(), 3);
    // Two back-offs of at least half of 20 ms and 40 ms.
    assert!(
        started.elapsed() >= Duration::from_millis(30),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn retries_are_bounded() {
    let server = FakeServer::start().await;
    for _ in 0..5 {
        server.push(status(503, None));
    }
    let client = OpenAiClient::new(config(&server)).unwrap();
    let e = client.complete(&hello()).await.unwrap_err();
    assert!(matches!(e, LlmError::Unavailable { .. }), "{e:?}");
    assert_eq!(server.hits(), 4, "one attempt and three retries");
}

#[tokio::test]
async fn a_retry_after_beyond_the_bound_is_not_waited() {
    let server = FakeServer::start().await;
    server.push(status(429, Some(3600)));
    let client = OpenAiClient::new(config(&server)).unwrap();
    let started = Instant::now();
    let e = client.complete(&hello()).await.unwrap_err();
    assert_eq!(
        e,
        LlmError::RateLimited {
            retry_after: Some(Duration::from_secs(3600))
        }
    );
    assert_eq!(server.hits(), 1);
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn invalid_requests_are_not_retried() {
    let server = FakeServer::start().await;
    server.push(status(400, None));
    let client = OpenAiClient::new(config(&server)).unwrap();
    let e = client.complete(&hello()).await.unwrap_err();
    assert!(matches!(e, LlmError::Invalid { status: 400, .. }), "{e:?}");
    assert_eq!(server.hits(), 1);
}

#[tokio::test]
async fn a_malformed_body_is_other_and_not_retried() {
    let server = FakeServer::start().await;
    server.push(Step::Raw {
        status: 200,
        content_type: "application/json",
        body: "{\"choices\": [oops".into(),
    });
    server.push(Step::Raw {
        status: 200,
        content_type: "application/json",
        body: r#"{"object": "chat.completion", "choices": []}"#.into(),
    });
    let client = OpenAiClient::new(config(&server)).unwrap();
    let e = client.complete(&hello()).await.unwrap_err();
    match &e {
        LlmError::Other { message } => {
            assert!(message.starts_with("malformed response body"), "{message}")
        }
        other => panic!("expected other, got {other:?}"),
    }
    assert_eq!(server.hits(), 1);
    let e = client.complete(&hello()).await.unwrap_err();
    assert_eq!(
        e,
        LlmError::Other {
            message: "malformed response: response has no choices".into()
        }
    );
}

#[tokio::test]
async fn a_slow_answer_times_out() {
    let server = FakeServer::start().await;
    server.push(Step::Slow(
        Duration::from_secs(3),
        Box::new(answer("too late")),
    ));
    let client = OpenAiClient::new(
        config(&server)
            .with_timeout(Duration::from_millis(300))
            .with_retries(0, Duration::ZERO, Duration::ZERO),
    )
    .unwrap();
    let started = Instant::now();
    let e = client.complete(&hello()).await.unwrap_err();
    assert_eq!(
        e,
        LlmError::Timeout {
            after: Duration::from_millis(300)
        }
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_timed_out_attempt_is_retried() {
    let server = FakeServer::start().await;
    server.push(Step::Slow(
        Duration::from_secs(3),
        Box::new(answer("too late")),
    ));
    server.push(answer("in time"));
    let client =
        OpenAiClient::new(config(&server).with_timeout(Duration::from_millis(300))).unwrap();
    assert_eq!(client.complete(&hello()).await.unwrap().content, "in time");
    assert_eq!(server.hits(), 2);
}

#[tokio::test]
async fn a_stalled_stream_times_out_after_its_last_chunk() {
    let server = FakeServer::start().await;
    let events = stream_events("a b c", &[], "stop", json!(null));
    let pieces = vec![
        (Duration::ZERO, events[0].clone()),
        (Duration::ZERO, events[1].clone()),
        (Duration::from_secs(3), events[2].clone()),
    ];
    server.push(Step::Sse(pieces));
    let client =
        OpenAiClient::new(config(&server).with_timeout(Duration::from_millis(300))).unwrap();
    let mut stream = client.stream(&hello()).await.unwrap();
    let mut items = Vec::new();
    while let Some(item) = stream.next().await {
        items.push(item);
    }
    assert!(
        items
            .iter()
            .any(|i| matches!(i, Ok(CompletionChunk::Content { text }) if text == "a "))
    );
    assert_eq!(
        items.last().unwrap(),
        &Err(LlmError::Timeout {
            after: Duration::from_millis(300)
        })
    );
}

#[tokio::test]
async fn a_malformed_stream_event_ends_the_stream_with_an_error() {
    let server = FakeServer::start().await;
    server.push(Step::Sse(vec![
        (
            Duration::ZERO,
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"}}]}\n\n".into(),
        ),
        (Duration::ZERO, "data: {broken\n\n".into()),
        (
            Duration::ZERO,
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"never\"}}]}\n\n".into(),
        ),
    ]));
    let client = OpenAiClient::new(config(&server)).unwrap();
    let items: Vec<_> = client.stream(&hello()).await.unwrap().collect().await;
    assert!(matches!(&items[0], Ok(CompletionChunk::Content { text }) if text == "ok"));
    assert!(
        matches!(items.last().unwrap(), Err(LlmError::Other { message }) if message.starts_with("malformed stream event"))
    );
    assert!(
        !items
            .iter()
            .any(|i| matches!(i, Ok(CompletionChunk::Content { text }) if text == "never"))
    );
}

#[tokio::test]
async fn a_server_that_ignores_stream_is_replayed() {
    let server = FakeServer::start().await;
    server.push(Step::Raw {
        status: 200,
        content_type: "application/json",
        body: json!({"model": "whole", "choices": [{"index": 0, "message": {"content": "all at once"}, "finish_reason": "length"}]}).to_string(),
    });
    let client = OpenAiClient::new(config(&server)).unwrap();
    let mut acc = ChunkAccumulator::new();
    let mut stream = client.stream(&hello()).await.unwrap();
    while let Some(c) = stream.next().await {
        acc.push(c.unwrap());
    }
    let r = acc.finish();
    assert_eq!(
        (r.content.as_str(), r.finish_reason),
        ("all at once", FinishReason::Length)
    );
    assert_eq!(r.model, "whole");
}

#[tokio::test]
async fn the_key_goes_in_the_configured_header() {
    let server = FakeServer::start().await;
    server.push(answer("a"));
    server.push(answer("b"));
    OpenAiClient::new(config(&server))
        .unwrap()
        .complete(&hello())
        .await
        .unwrap();
    let mut azure = config(&server);
    azure.auth = AuthStyle::ApiKeyHeader;
    OpenAiClient::new(azure)
        .unwrap()
        .complete(&hello())
        .await
        .unwrap();
    let headers = server.headers();
    assert_eq!(headers[0]["authorization"], "Bearer sk-test-key");
    assert!(headers[0].get("api-key").is_none());
    assert_eq!(headers[1]["api-key"], "sk-test-key");
    assert!(headers[1].get("authorization").is_none());
    assert_eq!(server.bodies()[0]["model"], "test-model");
}

#[tokio::test]
async fn a_closed_port_is_unavailable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let client = OpenAiClient::new(
        OpenAiConfig::new(format!("http://{addr}/v1"), "m").with_retries(
            1,
            Duration::from_millis(1),
            Duration::from_millis(2),
        ),
    )
    .unwrap();
    let e = client.complete(&hello()).await.unwrap_err();
    assert!(matches!(e, LlmError::Unavailable { .. }), "{e:?}");
}

#[tokio::test]
async fn embeddings_come_back_in_input_order() {
    let server = FakeServer::start().await;
    let embedder = OpenAiEmbedder::new(config(&server), "embed-small", None).unwrap();
    let texts = vec!["a".to_owned(), "bbb".to_owned(), "cc".to_owned()];
    let out = embedder.embed(&texts).await.unwrap();
    assert_eq!(out.model, "embed-small");
    assert_eq!(out.dimension, 3);
    assert_eq!(
        out.vectors,
        vec![
            vec![1.0, 97.0, 1.0],
            vec![3.0, 98.0, 1.0],
            vec![2.0, 99.0, 1.0]
        ]
    );
    assert_eq!(
        out.usage,
        Some(Usage {
            prompt_tokens: 6,
            completion_tokens: 0,
            total_tokens: 6
        })
    );
    assert_eq!(
        server.bodies()[0],
        json!({"model": "embed-small", "input": ["a", "bbb", "cc"], "encoding_format": "float"})
    );
    assert!(embedder.embed(&[]).await.unwrap().vectors.is_empty());
    assert_eq!(server.hits(), 1, "an empty input makes no call");
}

#[tokio::test]
async fn embedding_failures_are_classified_and_dimensions_checked() {
    let server = FakeServer::start().await;
    let texts = vec!["x".to_owned()];
    let strict = OpenAiEmbedder::new(config(&server), "embed-small", Some(8)).unwrap();
    let e = strict.embed(&texts).await.unwrap_err();
    assert_eq!(
        e,
        LlmError::Other {
            message: "asked for 8 dimensions, got 3".into()
        }
    );
    assert_eq!(server.bodies()[0]["dimensions"], 8);
    let no_retry = config(&server).with_retries(0, Duration::ZERO, Duration::ZERO);
    let embedder = OpenAiEmbedder::new(no_retry, "embed-small", None).unwrap();
    server.push(status(429, Some(2)));
    assert_eq!(
        embedder.embed(&texts).await.unwrap_err(),
        LlmError::RateLimited {
            retry_after: Some(Duration::from_secs(2))
        }
    );
    server.push(status(404, None));
    assert!(matches!(
        embedder.embed(&texts).await.unwrap_err(),
        LlmError::Invalid { status: 404, .. }
    ));
}

/// A server that never answers in time, a client patient for a minute with
/// three retries: the request's deadline bounds the whole call.
#[tokio::test]
async fn the_deadline_bounds_attempts_and_retries() {
    let server = FakeServer::start().await;
    for _ in 0..4 {
        server.push(Step::Slow(
            Duration::from_secs(30),
            Box::new(answer("too late")),
        ));
    }
    let client = OpenAiClient::new(
        config(&server)
            .with_timeout(Duration::from_secs(60))
            .with_retries(3, Duration::from_millis(10), Duration::from_millis(20)),
    )
    .unwrap();
    let started = Instant::now();
    let request = hello().with_deadline(started + Duration::from_millis(400));
    let e = client.complete(&request).await.unwrap_err();
    assert!(matches!(e, LlmError::Timeout { .. }), "{e:?}");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(4), "{took:?}");
    assert_eq!(server.hits(), 1, "no attempt starts after the deadline");
}

/// A back-off that would end after the deadline is not begun: the error
/// comes back at once.
#[tokio::test]
async fn no_back_off_ends_after_the_deadline() {
    let server = FakeServer::start().await;
    server.push(status(503, Some(2)));
    server.push(answer("after the wait"));
    let client = OpenAiClient::new(config(&server)).unwrap();
    let started = Instant::now();
    let request = hello().with_deadline(started + Duration::from_millis(500));
    let e = client.complete(&request).await.unwrap_err();
    assert!(matches!(e, LlmError::Unavailable { .. }), "{e:?}");
    assert!(started.elapsed() < Duration::from_millis(1500));
    assert_eq!(server.hits(), 1);
    // Without a deadline the same answer is waited for.
    server.push(status(503, Some(1)));
    server.push(answer("after the wait"));
    let r = client.complete(&hello()).await.unwrap();
    assert_eq!(r.content, "after the wait");
}

/// A deadline already past starts no attempt at all.
#[tokio::test]
async fn a_passed_deadline_sends_nothing() {
    let server = FakeServer::start().await;
    server.push(answer("never asked"));
    let client = OpenAiClient::new(config(&server)).unwrap();
    let request = hello().with_deadline(Instant::now());
    let e = client.complete(&request).await.unwrap_err();
    assert!(matches!(e, LlmError::Timeout { .. }), "{e:?}");
    assert_eq!(server.hits(), 0);
    assert!(client.stream(&request).await.is_err());
    assert_eq!(server.hits(), 0);
}

/// A stream stalls: the deadline ends it before the idle limit would.
#[tokio::test]
async fn the_deadline_ends_a_stalled_stream() {
    let server = FakeServer::start().await;
    let events = stream_events("a b c", &[], "stop", json!(null));
    let pieces = vec![
        (Duration::ZERO, events[0].clone()),
        (Duration::from_secs(30), events[1].clone()),
    ];
    server.push(Step::Sse(pieces));
    let client = OpenAiClient::new(config(&server).with_timeout(Duration::from_secs(60))).unwrap();
    let started = Instant::now();
    let request = hello().with_deadline(started + Duration::from_millis(400));
    let mut stream = client.stream(&request).await.unwrap();
    let mut last = None;
    while let Some(item) = stream.next().await {
        last = Some(item);
    }
    assert!(
        matches!(last, Some(Err(LlmError::Timeout { .. }))),
        "{last:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(4));
}

/// An error body echoing a key comes back scrubbed and cut.
#[tokio::test]
async fn error_bodies_are_scrubbed_and_cut() {
    let server = FakeServer::start().await;
    let echoed = format!(
        "Incorrect API key provided: sk-live-abcdef0123456789. Authorization: Bearer tok_0123456789abcdef {}",
        "x".repeat(2000)
    );
    server.push(Step::Raw {
        status: 401,
        content_type: "application/json",
        body: json!({"error": {"message": echoed}}).to_string(),
    });
    let client = OpenAiClient::new(config(&server)).unwrap();
    let e = client.complete(&hello()).await.unwrap_err();
    let LlmError::Invalid { status, message } = &e else {
        panic!("{e:?}");
    };
    assert_eq!(*status, 401);
    assert!(!message.contains("sk-live-abcdef"), "{message}");
    assert!(!message.contains("tok_0123456789abcdef"), "{message}");
    assert!(message.len() <= 512 + 3, "{}", message.len());
    assert!(!e.to_string().contains("sk-live"));
}
