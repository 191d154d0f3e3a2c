//! Access control at the edge: which scope each route needs (the one table, for HTTP and
//! for gRPC), reading the presented key, and the axum middleware and tower layer that ask
//! [`peregrine_auth::AccessControl`] and refuse with 401, 403 or 429 (gRPC:
//! UNAUTHENTICATED, PERMISSION_DENIED, RESOURCE_EXHAUSTED).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use peregrine_auth::{AccessControl, Denial, Grant, Requirement, Scope};

use crate::{ApiError, AppState};

/// Requests that reached access control, by key id and outcome (`allowed` or the
/// denial's reason). Key ids only: unknown keys count as `unknown`, so the label stays
/// bounded by the keys file.
pub const AUTH_REQUESTS: &str = "peregrine_auth_requests_total";

/// Who may call what. Cheap to clone; the keys can be replaced while serving (a reload
/// of the keys file).
#[derive(Clone)]
pub struct Access {
    control: Arc<ArcSwap<AccessControl>>,
    /// Health probes need a key (any key) too.
    pub protect_health: bool,
    /// `/metrics` needs a key (any key) too.
    pub protect_metrics: bool,
}

impl Access {
    pub fn new(control: AccessControl, protect_health: bool, protect_metrics: bool) -> Self {
        Access {
            control: Arc::new(ArcSwap::from_pointee(control)),
            protect_health,
            protect_metrics,
        }
    }

    /// No keys: every request passes.
    pub fn anonymous() -> Self {
        Self::new(AccessControl::anonymous(), false, false)
    }

    /// Puts new keys in place; requests already admitted keep their permits.
    pub fn replace(&self, control: AccessControl) {
        self.control.store(Arc::new(control));
    }

    fn health(&self) -> Requirement {
        if self.protect_health {
            Requirement::AnyKey
        } else {
            Requirement::Open
        }
    }

    /// What a route (its path template, as the router spells it) needs. Routes missing
    /// from the table need `admin`: a route added without thought is closed, not open.
    pub(crate) fn http_requirement(&self, method: &Method, route: &str) -> Requirement {
        let health = self.health();
        match (method.as_str(), route) {
            (_, "/health/live" | "/health/ready" | "/v2/health/live" | "/v2/health/ready") => health,
            (_, "/metrics") if self.protect_metrics => Requirement::AnyKey,
            (_, "/metrics" | "/openapi.json") => Requirement::Open,
            // The console's static files hold no data: its pages ask for the key and send
            // it with every API call they make.
            ("GET", "/" | "/ui" | "/ui/{file}") => Requirement::Open,
            (
                _,
                "/v2/repository/index"
                | "/v2/repository/models/{m}/load"
                | "/v2/repository/models/{m}/unload"
                | "/v2/repository/models/{m}/rollout"
                | "/debug/pprof/profile"
                | "/debug/pprof/heap",
            ) => Requirement::Scope(Scope::Admin),
            ("POST", "/v1/streams")
            | ("DELETE", "/v1/streams/{name}" | "/v1/events/{id}")
            | ("PUT", "/v1/streams/{name}/zones" | "/v1/streams/{name}/lines") => {
                Requirement::Scope(Scope::Streams)
            }
            ("POST", "/v1/detect" | "/v2/models/{m}/infer" | "/v2/models/{m}/versions/{v}/infer") => {
                Requirement::Scope(Scope::Infer)
            }
            ("GET", r) if r == "/v2" || r.starts_with("/v2/models/") || r.starts_with("/v1/") => {
                Requirement::Scope(Scope::Infer)
            }
            _ => Requirement::Scope(Scope::Admin),
        }
    }

    /// What a gRPC method (`/package.Service/Method`) needs: repository calls `admin`,
    /// health (`grpc.health.v1` and Triton's ServerLive/ServerReady) as HTTP health, the
    /// rest `infer`.
    pub(crate) fn grpc_requirement(&self, path: &str) -> Requirement {
        match path.strip_prefix("/inference.GRPCInferenceService/") {
            Some("RepositoryModelLoad" | "RepositoryModelUnload" | "RepositoryIndex") => {
                Requirement::Scope(Scope::Admin)
            }
            Some("ServerLive" | "ServerReady") => self.health(),
            Some(_) => Requirement::Scope(Scope::Infer),
            None if path.starts_with("/grpc.health.v1.Health/") => self.health(),
            None => Requirement::Scope(Scope::Admin),
        }
    }

    /// The decision for a request with these headers (HTTP) or metadata (gRPC, which
    /// travels as HTTP/2 headers). Refusals are logged with the reason and the key id.
    /// `what` names the request in the refusal's log line; it is formatted only then.
    fn decide(
        &self,
        headers: &HeaderMap,
        required: Requirement,
        what: &dyn std::fmt::Display,
    ) -> Result<Grant, Denial> {
        if required == Requirement::Open {
            return self.control.load().authorize(None, required);
        }
        let decision = self.control.load().authorize(presented_key(headers), required);
        let (key_id, outcome) = match &decision {
            Ok(grant) => (grant.key_id.clone(), "allowed"),
            Err(denial) => {
                tracing::warn!(
                    key_id = denial.key_id(),
                    reason = denial.outcome(),
                    request = %what,
                    "refused: {denial}"
                );
                (denial.key_id().to_string(), denial.outcome())
            }
        };
        metrics::counter!(AUTH_REQUESTS, "key_id" => key_id, "outcome" => outcome).increment(1);
        decision
    }
}

/// The key a request presents: `Authorization: Bearer <key>`, else `x-api-key: <key>`.
fn presented_key(headers: &HeaderMap) -> Option<&str> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, key)| key.trim());
    bearer.or_else(|| {
        headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    })
}

/// The HTTP middleware: every matched route passes here before its handler. The grant
/// (and the key's concurrency permit) lives until the handler has produced its response.
pub(crate) async fn gate(
    State(state): State<AppState>,
    route: Option<MatchedPath>,
    request: Request,
    next: Next,
) -> Response {
    let path = route
        .as_ref()
        .map_or_else(|| request.uri().path(), |r| r.as_str());
    let required = state.access.http_requirement(request.method(), path);
    let decision = state.access.decide(
        request.headers(),
        required,
        &format_args!("{} {path}", request.method()),
    );
    match decision {
        Ok(grant) => {
            let response = next.run(request).await;
            drop(grant);
            response
        }
        Err(denial) => ApiError::from(denial).into_response(),
    }
}

/// The gRPC server's layer: the same decisions, answered with gRPC statuses.
#[derive(Clone)]
pub struct GrpcAccessLayer(pub Access);

impl<S> tower::Layer<S> for GrpcAccessLayer {
    type Service = GrpcAccess<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcAccess {
            access: self.0.clone(),
            inner,
        }
    }
}

#[derive(Clone)]
pub struct GrpcAccess<S> {
    access: Access,
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> tower::Service<axum::http::Request<B>> for GrpcAccess<S>
where
    S: tower::Service<axum::http::Request<B>, Response = axum::http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: axum::http::Request<B>) -> Self::Future {
        let path = request.uri().path();
        let required = self.access.grpc_requirement(path);
        match self.access.decide(request.headers(), required, &path) {
            Ok(grant) => {
                let response = self.inner.call(request);
                Box::pin(async move {
                    let response = response.await;
                    drop(grant);
                    response
                })
            }
            Err(denial) => {
                let status = tonic::Status::from(ApiError::from(denial));
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    #[test]
    fn every_documented_route_has_its_scope_and_none_falls_to_the_default() {
        let doc: serde_json::Value = serde_json::from_str(crate::OPENAPI).unwrap();
        let access = Access::anonymous();
        let admin = [
            "/v2/repository/index",
            "/v2/repository/models/{m}/load",
            "/v2/repository/models/{m}/unload",
            "/v2/repository/models/{m}/rollout",
            "/debug/pprof/profile",
            "/debug/pprof/heap",
        ];
        let streams = [
            ("POST", "/v1/streams"),
            ("DELETE", "/v1/streams/{name}"),
            ("DELETE", "/v1/events/{id}"),
            ("PUT", "/v1/streams/{name}/zones"),
            ("PUT", "/v1/streams/{name}/lines"),
        ];
        let open = [
            "/health/live",
            "/health/ready",
            "/v2/health/live",
            "/v2/health/ready",
            "/metrics",
            "/openapi.json",
            "/",
            "/ui",
            "/ui/{file}",
        ];
        for (path, item) in doc["paths"].as_object().unwrap() {
            for method in item.as_object().unwrap().keys() {
                let method_upper = method.to_uppercase();
                let got = access.http_requirement(&method_upper.parse().unwrap(), path);
                let expected = if admin.contains(&path.as_str()) {
                    Requirement::Scope(Scope::Admin)
                } else if streams.contains(&(method_upper.as_str(), path.as_str())) {
                    Requirement::Scope(Scope::Streams)
                } else if open.contains(&path.as_str()) {
                    Requirement::Open
                } else {
                    Requirement::Scope(Scope::Infer)
                };
                assert_eq!(got, expected, "{method_upper} {path}");
            }
        }
        assert_eq!(
            access.http_requirement(&Method::PATCH, "/v1/new-thing"),
            Requirement::Scope(Scope::Admin)
        );
    }

    #[test]
    fn health_and_metrics_can_be_protected() {
        let access = Access::new(AccessControl::anonymous(), true, true);
        for route in ["/health/ready", "/v2/health/live", "/metrics"] {
            assert_eq!(access.http_requirement(&Method::GET, route), Requirement::AnyKey);
        }
        assert_eq!(
            access.grpc_requirement("/grpc.health.v1.Health/Check"),
            Requirement::AnyKey
        );
        assert_eq!(
            access.http_requirement(&Method::GET, "/openapi.json"),
            Requirement::Open
        );
    }

    #[test]
    fn grpc_methods_map_like_their_routes() {
        let access = Access::anonymous();
        let method = |m: &str| access.grpc_requirement(&format!("/inference.GRPCInferenceService/{m}"));
        assert_eq!(method("RepositoryModelUnload"), Requirement::Scope(Scope::Admin));
        assert_eq!(method("ModelInfer"), Requirement::Scope(Scope::Infer));
        assert_eq!(method("ModelMetadata"), Requirement::Scope(Scope::Infer));
        assert_eq!(method("ServerReady"), Requirement::Open);
        assert_eq!(
            access.grpc_requirement("/grpc.health.v1.Health/Watch"),
            Requirement::Open
        );
        assert_eq!(
            access.grpc_requirement("/other.Service/X"),
            Requirement::Scope(Scope::Admin)
        );
    }

    #[test]
    fn the_key_comes_from_bearer_or_x_api_key() {
        let mut h = HeaderMap::new();
        assert_eq!(presented_key(&h), None);
        h.insert("x-api-key", HeaderValue::from_static("pk_x"));
        assert_eq!(presented_key(&h), Some("pk_x"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("bearer pk_b"));
        assert_eq!(presented_key(&h), Some("pk_b"), "Bearer wins, in any case");
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic dXNlcg=="));
        assert_eq!(presented_key(&h), Some("pk_x"), "not a bearer token");
    }
}
