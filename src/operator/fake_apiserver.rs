//! A fake apiserver for the reconciler's unit tests: a [`kube::Client`] over a mock service
//! whose answers come from a route table, recording every request, so a test can say what the
//! reconcile read, wrote and published without a cluster. (The world tests run the real
//! apiserver; these pin down the reconcile's decisions one by one, in milliseconds.)

use std::sync::{Arc, Mutex};

use http::{Request, Response, StatusCode};
use kube::client::Body;

/// One request the reconcile made.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    /// The query string (`fieldManager=...&force=true`), empty when there is none.
    pub query: String,
    pub content_type: String,
    pub body: serde_json::Value,
}

/// What the fake answers: `(status, body)` for a request, or `None` for 404.
pub type Routes = Box<dyn Fn(&Seen) -> Option<(StatusCode, serde_json::Value)> + Send>;

/// A route answering with this status leaves the request unanswered: the client waits on it
/// until it is dropped, as an operator killed mid-request never sees its answer, and the
/// request never reaches the fake's store.
pub fn no_answer() -> (StatusCode, serde_json::Value) {
    (NO_ANSWER, serde_json::Value::Null)
}

const NO_ANSWER: StatusCode = StatusCode::NETWORK_AUTHENTICATION_REQUIRED;

/// A client and the log of what it was asked; the fake serves until the client is dropped.
pub fn client(routes: Routes) -> (kube::Client, Arc<Mutex<Vec<Seen>>>) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        let mut unanswered = Vec::new();
        while let Some((request, respond)) = handle.next_request().await {
            let (parts, body) = request.into_parts();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            let req = Seen {
                method: parts.method.to_string(),
                path: parts.uri.path().to_string(),
                query: parts.uri.query().unwrap_or_default().to_string(),
                content_type: parts
                    .headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string(),
                body: serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
            };
            let (status, body) = routes(&req).unwrap_or_else(|| {
                (
                    StatusCode::NOT_FOUND,
                    serde_json::json!({
                        "kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "reason": "NotFound", "code": 404, "message": "not found",
                    }),
                )
            });
            log.lock().map(|mut l| l.push(req)).ok();
            if status == NO_ANSWER {
                unanswered.push(respond);
                continue;
            }
            let response = Response::builder()
                .status(status)
                .body(Body::from(serde_json::to_vec(&body).unwrap_or_default()));
            if let Ok(r) = response {
                respond.send_response(r);
            }
        }
    });
    (kube::Client::new(service, "default"), seen)
}
