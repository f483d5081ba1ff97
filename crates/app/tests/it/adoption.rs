//! Adoption routes: state, events, activity, gate, prompt block, plans and
//! catalogs, on a real listener.

use std::sync::Arc;
use std::time::Duration;

use parlance_postgres::testing::test_pool;
use parlance_testkit::{ManualClock, SequentialIds};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::documented::assert_documented;
use crate::support::{TestServer, keys};

const BASE: &str = "/v1/products/acme";

fn plan() -> Value {
    json!({
        "workflows": [
            {"workflow_id": "create_project", "name": "Create a project",
             "why": "Everything hangs off a project",
             "steps": [
                {"step_id": "open_form", "name": "Open the form",
                 "activity_signals": {"any_of": [{"canonical_url_glob": "/projects/new*"}]}},
                {"step_id": "save", "name": "Save it",
                 "activity_signals": {"any_of": [{"type": "submit", "title_contains": "create"}]}}
             ],
             "activity_signals": {"any_of": [{"event_type": "project_created"}]}},
            {"workflow_id": "invite_team", "name": "Invite your team", "role": "Admin",
             "prerequisite_workflow_ids": ["create_project"],
             "activity_signals": {"any_of": [{"canonical_url_prefix": "/settings/team", "min_count": 2}]}},
            {"workflow_id": "billing", "name": "Set up billing", "role": "owner"},
            {"workflow_id": 42},
            {"workflow_id": "create_project", "name": "duplicate"}
        ]
    })
}

async fn put_plan(s: &TestServer) -> Value {
    let (status, _, body) = s
        .send(
            Method::PUT,
            &format!("{BASE}/onboarding-plan"),
            Some(&plan()),
            true,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

async fn activity_flow(s: &TestServer) {
    let put = put_plan(s).await;
    assert_eq!(put["skipped"].as_array().unwrap().len(), 2, "{put}");

    // A new admin explores: the first step of create_project is detected.
    let batch = json!({
        "metadata": {"role": "admin", "team": "ops"},
        "discovered_features": ["/dashboard", "/projects", " /projects "],
        "actions": [
            {"event_type": "$pageview", "canonical_url": "/projects/new", "title": "New project"},
            {"event_type": "$pageview", "canonical_url": "/settings/team"}
        ]
    });
    let path = format!("{BASE}/users/u-1/adoption/activity");
    let (status, _, body) = s.send(Method::POST, &path, Some(&batch), true).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["version"], 1);
    assert_eq!(
        body["state"]["discovered_features"],
        json!(["/dashboard", "/projects"])
    );
    assert_eq!(
        body["detected"]["steps"][0]["step_id"], "open_form",
        "{}",
        body["detected"]
    );
    assert_eq!(
        body["state"]["onboarding"]["workflow_progress"]["create_project"]["status"],
        "in_progress"
    );

    // The project is created and the team page visited twice: both
    // workflows complete, and so does the admin's plan.
    s.clock.advance(Duration::from_secs(90));
    let batch = json!({
        "actions": [
            {"event_type": "project_created", "type": "submit", "title": "Create project"},
            {"event_type": "$pageview", "canonical_url": "/settings/team"},
            {"event_type": "$pageview", "canonical_url": "/settings/team/invite"}
        ]
    });
    let (status, _, body) = s.send(Method::POST, &path, Some(&batch), true).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["version"], 2);
    assert_eq!(body["detected"]["onboarding_completed"], true, "{body}");
    insta::assert_json_snapshot!("activity_completes_plan", &body);

    let (status, _, body) = s
        .send(
            Method::GET,
            &format!("{BASE}/users/u-1/adoption/prompt-block"),
            None,
            true,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body["prompt_block"],
        "[USER ADOPTION STATE]\nrole: admin\njourney: onboarding\nmastery: novice (0/10)\nguidance: favor step-by-step teaching and confirm basics"
    );

    // Onboarding is complete, so the gate stays closed.
    let (status, _, body) = s
        .send(
            Method::POST,
            &format!("{BASE}/users/u-1/adoption/gate"),
            Some(&json!({"seconds_on_app": 600.0})),
            true,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!({"passed": false, "code": "already_onboarded", "reason": "already_onboarded"})
    );
}

/// Every adoption route answers, successes and refusals alike, as the API
/// document describes.
#[tokio::test]
async fn answers_match_the_api_document() {
    let s = TestServer::memory().await;
    let user = format!("{BASE}/users/u-doc/adoption");
    let other = format!("{BASE}/users/u-doc-2/adoption");
    let snapshot = json!({
        "_v": 1, "user_id": "u-doc-2", "metadata": {"role": "admin"},
        "mastery": {"rating": 4, "level": "intermediate", "description": "basics"},
        "onboarding": {"workflow_progress": {"w": {"workflow_id": "w", "status": "completed",
            "confidence": 1, "steps": {"a": {"step_id": "a", "status": "completed"}}}},
            "last_step_in": {"should_step_in": true, "reason": "ready"}},
        "sessions": {"count": 1, "index": [{"session_id": "s0", "session_number": 1,
            "started_at": 1767225600.0, "captured_at": 1767225600.0}]},
        "first_seen_at": 1767225600.0, "last_updated_at": 1767225600.0
    });
    let calls = [
        (
            Method::PUT,
            format!("{BASE}/onboarding-plan"),
            Some(plan()),
            StatusCode::OK,
        ),
        (
            Method::GET,
            format!("{BASE}/onboarding-plan"),
            None,
            StatusCode::OK,
        ),
        (
            Method::GET,
            format!("{BASE}/onboarding-plan?role=nobody"),
            None,
            StatusCode::NOT_FOUND,
        ),
        (
            Method::PUT,
            format!("{BASE}/onboarding-plan"),
            Some(json!({"workflows": {}})),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            Method::PUT,
            format!("{BASE}/tour-catalog"),
            Some(json!({"role": "admin", "tours": [
                {"tour_id": "create_project", "name": "Create", "use_when": "new"},
                {"name": "no id"}
            ]})),
            StatusCode::OK,
        ),
        (
            Method::GET,
            format!("{BASE}/tour-catalog?role=admin"),
            None,
            StatusCode::OK,
        ),
        (Method::GET, user.clone(), None, StatusCode::NOT_FOUND),
        (
            Method::GET,
            format!("{BASE}/users/{}/adoption", "x".repeat(300)),
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            Method::POST,
            format!("{user}/activity"),
            Some(json!({
                "metadata": {"role": "admin"},
                "discovered_features": ["/dashboard"],
                "actions": [{"event_type": "project_created"},
                            {"event_type": "$pageview", "canonical_url": "/projects/new"}]
            })),
            StatusCode::OK,
        ),
        (
            Method::POST,
            format!("{user}/events"),
            Some(json!({"events": [
                {"kind": "set_mastery", "rating": 4, "level": "intermediate"},
                {"kind": "record_session", "session_id": "s1", "session_number": 1,
                 "started_at": 1767225600.0},
                {"kind": "mark_welcomed"}
            ]})),
            StatusCode::OK,
        ),
        (
            Method::POST,
            format!("{user}/events"),
            Some(
                json!({"events": [{"kind": "upsert_step_progress", "workflow_id": "none",
                "step_id": "a", "status": "completed", "confidence": 1}]}),
            ),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            Method::POST,
            format!("{user}/gate"),
            Some(json!({"seconds_on_app": 120})),
            StatusCode::OK,
        ),
        (
            Method::GET,
            format!("{user}/prompt-block"),
            None,
            StatusCode::OK,
        ),
        (Method::GET, user.clone(), None, StatusCode::OK),
        (
            Method::PUT,
            other.clone(),
            Some(json!({"state": snapshot})),
            StatusCode::CREATED,
        ),
        (
            Method::PUT,
            other.clone(),
            Some(json!({"state": snapshot, "expected_version": 1})),
            StatusCode::OK,
        ),
        (
            Method::PUT,
            other.clone(),
            Some(json!({"state": snapshot})),
            StatusCode::CONFLICT,
        ),
        (
            Method::POST,
            format!("{BASE}/tours/match"),
            Some(json!({"query": " "})),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (Method::DELETE, user.clone(), None, StatusCode::NO_CONTENT),
        (Method::DELETE, user, None, StatusCode::NOT_FOUND),
    ];
    for (method, path, body, expected) in calls {
        let (status, _, answer) = s.send(method.clone(), &path, body.as_ref(), true).await;
        assert_eq!(status, expected, "{method} {path}: {answer}");
        assert_documented(&method, &path, status, &answer);
    }
}

#[tokio::test]
async fn activity_completes_the_plan_on_memory() {
    let s = TestServer::memory().await;
    activity_flow(&s).await;
}

#[tokio::test]
async fn activity_completes_the_plan_on_postgres() {
    let Some(pool) = test_pool().await else {
        return;
    };
    let clock = Arc::new(ManualClock::new());
    let mut c = parlance_app::Components::postgres(pool, keys());
    c.clock = clock.clone();
    c.ids = Arc::new(SequentialIds::new());
    let s = TestServer::start(c.build(), clock).await;
    activity_flow(&s).await;
}

#[tokio::test]
async fn plans_and_catalogs_per_role() {
    let s = TestServer::memory().await;
    let body = put_plan(&s).await;
    insta::assert_json_snapshot!("plan_put", body);
    let (status, _, got) = s
        .send(Method::GET, &format!("{BASE}/onboarding-plan"), None, true)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(got["workflows"], body["workflows"]);
    let (status, ctype, got) = s
        .send(
            Method::GET,
            &format!("{BASE}/onboarding-plan?role=viewer"),
            None,
            true,
        )
        .await;
    assert_eq!(
        (status, ctype.as_str()),
        (StatusCode::NOT_FOUND, "application/problem+json")
    );
    assert_eq!(got["status"], 404);

    let cyclic = json!({"role": "Admin", "workflows": [
        {"workflow_id": "a", "prerequisite_workflow_ids": ["b"]},
        {"workflow_id": "b", "prerequisite_workflow_ids": ["a"]},
        {"workflow_id": "c", "prerequisite_workflow_ids": ["nope"]}
    ]});
    let (status, ctype, body) = s
        .send(
            Method::PUT,
            &format!("{BASE}/onboarding-plan"),
            Some(&cyclic),
            true,
        )
        .await;
    assert_eq!(
        (status, ctype.as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, "application/problem+json")
    );
    insta::assert_json_snapshot!("plan_with_cycle", body);

    let catalog = json!({"tours": [
        {"tour_id": "create_project", "name": "Create a project", "use_when": "user wants a new project"},
        {"id": "invite_team", "user_tour_name": "Invite", "description": "add people", "role": "admin"},
        {"tour_id": 7},
        "junk"
    ]});
    let (status, _, body) = s
        .send(
            Method::PUT,
            &format!("{BASE}/tour-catalog"),
            Some(&catalog),
            true,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    insta::assert_json_snapshot!("catalog_put", body);
    let (status, _, got) = s
        .send(Method::GET, &format!("{BASE}/tour-catalog"), None, true)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(got["tours"], body["tours"]);
}

#[tokio::test]
async fn events_change_the_state_in_order() {
    let s = TestServer::memory().await;
    let path = format!("{BASE}/users/u-2/adoption/events");
    let events = json!({
        "metadata": {"role": "consultant"},
        "events": [
            {"kind": "set_mastery", "rating": 42, "level": "proficient", "description": "ships reports"},
            {"kind": "set_journey_state", "state": "onboarded"},
            {"kind": "upsert_workflow_progress", "workflow_id": "w1", "status": "completed", "confidence": 0.9},
            {"kind": "upsert_step_progress", "workflow_id": "w1", "step_id": "s1", "status": "in_progress", "confidence": 0.4},
            {"kind": "record_discovered_features", "features": ["/a", "/a", "/b"]},
            {"kind": "mark_welcomed"},
            {"kind": "set_current_session", "session_id": " ses-9 "},
            {"kind": "record_session", "session_id": "ses-9", "session_number": 1, "started_at": 1767225500.5}
        ]
    });
    let (status, _, body) = s.send(Method::POST, &path, Some(&events), true).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    insta::assert_json_snapshot!("events_applied", &body);
    assert_eq!(body["state"]["mastery"]["rating"], 10);
    assert_eq!(body["state"]["sessions"]["current_session_id"], "ses-9");

    // Nothing is applied when one event is refused.
    let bad = json!({"events": [
        {"kind": "set_journey_state", "state": "onboarding"},
        {"kind": "upsert_step_progress", "workflow_id": "missing", "step_id": "s", "status": "completed", "confidence": 1}
    ]});
    let (status, ctype, body) = s.send(Method::POST, &path, Some(&bad), true).await;
    assert_eq!(
        (status, ctype.as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, "application/problem+json")
    );
    insta::assert_json_snapshot!("event_refused", body);
    let (_, _, got) = s
        .send(
            Method::GET,
            &format!("{BASE}/users/u-2/adoption"),
            None,
            true,
        )
        .await;
    assert_eq!(got["state"]["journey_state"], "onboarded");
    assert_eq!(got["version"], 1);

    // Unknown kinds and enum values are 422 problems naming the field.
    for bad in [
        json!({"events": [{"kind": "teleport"}]}),
        json!({"events": [{"kind": "set_journey_state", "state": "ONBOARDED"}]}),
        json!({"events": [{"kind": "set_mastery", "rating": "7", "level": "novice"}]}),
    ] {
        let (status, ctype, _) = s.send(Method::POST, &path, Some(&bad), true).await;
        assert_eq!(
            (status, ctype.as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, "application/problem+json"),
            "{bad}"
        );
    }
}

#[tokio::test]
async fn put_state_validates_and_compares_versions() {
    let s = TestServer::memory().await;
    let path = format!("{BASE}/users/u-3/adoption");
    let (status, _, _) = s.send(Method::GET, &path, None, true).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let snapshot = json!({
        "_v": 1, "user_id": "u-3", "metadata": {"role": "admin"},
        "journey_state": "mystery", "mastery": {"rating": 4, "level": "intermediate", "description": ""},
        "onboarding": {"workflow_progress": {"w": {"workflow_id": "w", "status": "completed", "confidence": 1}}},
        "first_seen_at": 1767225600.0, "last_updated_at": 1767225600.0
    });
    let (status, _, body) = s
        .send(Method::PUT, &path, Some(&json!({"state": snapshot})), true)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // An unknown journey degrades to the safe default.
    assert_eq!(body["state"]["journey_state"], "onboarding");
    assert_eq!(body["version"], 1);

    // Creating again, or replacing a stale version, is a 409.
    let (status, ctype, body) = s
        .send(Method::PUT, &path, Some(&json!({"state": snapshot})), true)
        .await;
    assert_eq!(
        (status, ctype.as_str()),
        (StatusCode::CONFLICT, "application/problem+json")
    );
    insta::assert_json_snapshot!("put_conflict", body);
    let (status, _, _) = s
        .send(
            Method::PUT,
            &path,
            Some(&json!({"state": snapshot, "expected_version": 7})),
            true,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, _, body) = s
        .send(
            Method::PUT,
            &path,
            Some(&json!({"state": snapshot, "expected_version": 1})),
            true,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["version"], 2);

    // A value that cannot be represented is refused with its path.
    let mut bad = snapshot.clone();
    bad["onboarding"]["workflow_progress"]["w"]["confidence"] = json!("very");
    let (status, _, body) = s
        .send(
            Method::PUT,
            &path,
            Some(&json!({"state": bad, "expected_version": 2})),
            true,
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    insta::assert_json_snapshot!("put_bad_snapshot", body);

    let mut other = snapshot.clone();
    other["user_id"] = json!("someone-else");
    let (status, _, body) = s
        .send(
            Method::PUT,
            &path,
            Some(&json!({"state": other, "expected_version": 2})),
            true,
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["field"], "$.user_id");

    let (status, _, _) = s.send(Method::DELETE, &path, None, true).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _, _) = s.send(Method::DELETE, &path, None, true).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn gate_follows_the_reference_order() {
    let s = TestServer::memory().await;
    let gate = format!("{BASE}/users/u-4/adoption/gate");
    let cfg = json!({"role_allowlist": ["consultant"], "min_seconds_on_app": 60.0,
                     "min_distinct_features": 3, "welcome_cooldown_s": 600.0, "max_proactive_support": 3});
    // An unknown user is judged as a fresh one (nothing is saved).
    let (status, _, body) = s
        .send(
            Method::POST,
            &gate,
            Some(&json!({"seconds_on_app": 120.0, "config": cfg})),
            true,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["reason"], "role_not_allowed:unknown");
    let (status, _, _) = s
        .send(
            Method::GET,
            &format!("{BASE}/users/u-4/adoption"),
            None,
            true,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let events = json!({"metadata": {"role": " Consultant"}, "events": [
        {"kind": "record_discovered_features", "features": ["/a", "/b"]}
    ]});
    s.send(
        Method::POST,
        &format!("{BASE}/users/u-4/adoption/events"),
        Some(&events),
        true,
    )
    .await;
    let mut reasons = Vec::new();
    for req in [
        json!({"seconds_on_app": 30.0, "config": cfg}),
        json!({"seconds_on_app": 60.0, "config": cfg}),
        json!({"seconds_on_app": 60.0, "distinct_features_seen": 3, "config": cfg}),
    ] {
        let (_, _, body) = s.send(Method::POST, &gate, Some(&req), true).await;
        reasons.push(body["reason"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        reasons,
        [
            "exploring_min_time_not_met",
            "exploring_min_features_not_met",
            "ok"
        ]
    );
    s.send(
        Method::POST,
        &format!("{BASE}/users/u-4/adoption/events"),
        Some(&json!({"events": [{"kind": "mark_welcomed"}]})),
        true,
    )
    .await;
    let (_, _, body) = s
        .send(
            Method::POST,
            &gate,
            Some(&json!({"seconds_on_app": 600.0, "distinct_features_seen": 9, "config": cfg})),
            true,
        )
        .await;
    assert_eq!(body["code"], "within_cooldown");
    let (status, _, body) = s
        .send(
            Method::POST,
            &gate,
            Some(&json!({"seconds_on_app": -1.0})),
            true,
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["field"], "seconds_on_app");
}

#[tokio::test]
async fn another_products_records_do_not_exist() {
    let s = TestServer::memory().await;
    let (status, _, _) = s
        .send(
            Method::GET,
            "/v1/products/other/users/u-1/adoption",
            None,
            true,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) = s
        .send(
            Method::PUT,
            "/v1/products/other/onboarding-plan",
            Some(&plan()),
            true,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// A journey change and its audit entry are one commit: when the entry
/// cannot be written, the change fails and the record stays as it was (the
/// entry used to be appended after the save, and its failure only logged).
#[tokio::test]
async fn a_journey_change_whose_audit_entry_fails_is_not_saved_on_postgres() {
    let Some(pool) = test_pool().await else {
        return;
    };
    let clock = Arc::new(ManualClock::new());
    let mut c = parlance_app::Components::postgres(pool.clone(), keys());
    c.clock = clock.clone();
    c.ids = Arc::new(SequentialIds::new());
    let s = TestServer::start(c.build(), clock).await;
    let events = format!("{BASE}/users/u-9/adoption/events");
    let (status, _, body) = s
        .send(
            Method::POST,
            &events,
            Some(&json!({"events": [{"kind": "mark_judged"}]})),
            true,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let record = format!("{BASE}/users/u-9/adoption");
    let (_, _, before) = s.send(Method::GET, &record, None, true).await;
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_adoption_audit() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN IF NEW.entity_kind = 'adoption' THEN RAISE EXCEPTION 'audit refused'; END IF; \
         RETURN NEW; END $$; \
         CREATE TRIGGER refuse_adoption_audit BEFORE INSERT ON audit_log \
         FOR EACH ROW EXECUTE FUNCTION refuse_adoption_audit();",
    )
    .execute(&pool)
    .await
    .unwrap();
    s.clock.advance(Duration::from_secs(5));
    let onboarded = json!({"events": [{"kind": "set_journey_state", "state": "onboarded"}]});
    let (status, ctype, body) = s.send(Method::POST, &events, Some(&onboarded), true).await;
    assert!(status.is_server_error(), "{status} {body}");
    assert_eq!(ctype, "application/problem+json");
    let (_, _, after) = s.send(Method::GET, &record, None, true).await;
    assert_eq!(after, before, "nothing saved");
    sqlx::raw_sql("DROP TRIGGER refuse_adoption_audit ON audit_log")
        .execute(&pool)
        .await
        .unwrap();
    let (status, _, body) = s.send(Method::POST, &events, Some(&onboarded), true).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["state"]["journey_state"], "onboarded");
    assert_eq!(body["version"], 2);
    let trail: Vec<(Option<String>, String, String)> = sqlx::query_as(
        "SELECT from_state, to_state, cause FROM audit_log \
         WHERE product_id = 'acme' AND entity_kind = 'adoption' AND entity_id = 'u-9' ORDER BY seq",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        trail,
        [(
            Some("onboarding".to_owned()),
            "onboarded".to_owned(),
            "set_journey_state".to_owned()
        )]
    );
}
