//! The admin listener: `/metrics` (Prometheus text), `/healthz` (the process
//! serves), `/readyz` (config loaded; store usable, degraded or draining),
//! all open; and, behind `[admin].token_file`'s token, the admin API under
//! `/v1/` and the status page at `/`.

mod api_keys;
pub(crate) mod auth;
mod clients;
pub(crate) mod constant_time;
mod lookup;
mod overrides;
mod reply;
pub(crate) mod status;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use http::{Method, Response};
use log::{debug, info, warn};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use serde_json::Value;

use auth::{authenticate, Credential, COOKIE_NAME, SESSION_S};
use lookup::Lookup;
use reply::{error, html, json_reply, text, ApiError};

use crate::admin::status::{unix_now, Scene};
use crate::server::state::AppState;
use floodgate_limiter::clock::{Clock, SystemClock};
use floodgate_limiter::log_throttle::LogThrottle;
use floodgate_policy::identity::form_decode;

const STATUS_PAGE: &str = include_str!("status.html");
/// The page's script: served on its own, so that the page's policy runs
/// no inline script (nothing injected into the page could run).
const STATUS_SCRIPT: &str = include_str!("status.js");
const LOGIN_PAGE: &str = include_str!("login.html");

/// A request body the API reads at most (a credit is a few dozen bytes).
const MAX_BODY: usize = 16 * 1024;

/// An import's body at most: `MAX_IMPORT` keys of up to 256 bytes with
/// their tier and label.
const MAX_IMPORT_BODY: usize = 8 * 1024 * 1024;

pub(crate) struct Admin {
    state: Arc<AppState>,
    refusals: RefusalLog,
}

impl Admin {
    pub(crate) fn new(state: Arc<AppState>) -> Self {
        Admin {
            state,
            refusals: RefusalLog::default(),
        }
    }
}

/// Calls refused for want of the token, logged at most once per 10 s with
/// how many came since: a client guessing tokens cannot flood the log.
struct RefusalLog(LogThrottle);

impl Default for RefusalLog {
    fn default() -> Self {
        RefusalLog(LogThrottle::new(Duration::from_secs(10)))
    }
}

impl RefusalLog {
    fn refused(&self, what: impl FnOnce() -> String) {
        if let Some(more) = self.0.due(SystemClock.now_us()) {
            let more = if more > 0 {
                format!(" ({more} more refused since the last such line)")
            } else {
                String::new()
            };
            warn!("admin: {}{more}", what());
        }
    }
}

fn api_off() -> ApiError {
    ApiError::not_found(
        "admin_api_off",
        "the admin API is off: set [admin].token_file (and [server].admin_listen)",
    )
}

/// `a=1&b=2`, each side form-decoded.
fn query_params(query: Option<&str>) -> Params {
    query
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let decode = |s: &str| String::from_utf8_lossy(&form_decode(s)).into_owned();
            (decode(k), decode(v))
        })
        .collect()
}

/// The request body, up to `MAX_BODY`.
async fn read_body(session: &mut ServerSession) -> Result<Vec<u8>, ApiError> {
    read_body_up_to(session, MAX_BODY).await
}

/// The request body, up to `most` bytes.
async fn read_body_up_to(session: &mut ServerSession, most: usize) -> Result<Vec<u8>, ApiError> {
    let mut body = Vec::new();
    loop {
        match session.read_request_body().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > most {
                    return Err(ApiError {
                        status: 413,
                        code: "body_too_large",
                        reason: format!("the body is over {most} bytes"),
                    });
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(body),
            Err(e) => return Err(ApiError::bad_request(format!("cannot read the body: {e}"))),
        }
    }
}

/// Named values, as a query string or a JSON body gives them.
type Params = Vec<(String, String)>;

/// A JSON object's fields as parameters; `units` as a number.
fn body_params(body: &[u8]) -> Result<(Params, Option<u64>), ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not JSON: {e}")))?;
    let Value::Object(fields) = value else {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    };
    let mut params = Vec::new();
    let mut units = None;
    for (name, value) in fields {
        match (name.as_str(), value) {
            ("units", Value::Number(n)) => units = n.as_u64(),
            ("units", _) => {}
            (_, Value::String(s)) => params.push((name, s)),
            (name, _) => {
                return Err(ApiError::bad_request(format!(
                    "{name}: a string is expected"
                )))
            }
        }
    }
    Ok((params, units))
}

fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

impl Admin {
    /// `/v1/...`, authenticated.
    async fn api(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let runtime = self.state.runtime.load_full();
        let Some(token) = &runtime.admin_token else {
            return error(&api_off());
        };
        let request = session.req_header();
        let (method, path) = (request.method.clone(), request.uri.path().to_string());
        let query = request.uri.query().map(str::to_string);
        let peer = session
            .client_addr()
            .map_or_else(|| "?".to_string(), |a| a.to_string());
        let Some(credential) = authenticate(token, &request.headers, unix_now()) else {
            self.refusals
                .refused(|| format!("{method} {path} from {peer} refused: no valid token"));
            return error(&ApiError {
                status: 401,
                code: "unauthorized",
                reason: "send the admin token: Authorization: Bearer <token>".into(),
            });
        };
        let changes = method != Method::GET;
        if changes && credential != Credential::Bearer {
            return error(&ApiError {
                status: 403,
                code: "bearer_required",
                reason: "a call that changes state needs the Authorization header, not the page's cookie".into(),
            });
        }
        let policy = &runtime.policy;
        let store = self.state.store.as_ref();
        let mut who = None;
        let result = match route(&path) {
            None => Err(ApiError::not_found(
                "not_found",
                format!("try {}", routes_hint()),
            )),
            Some(route) if !route.serves(&method) => Err(ApiError {
                status: 405,
                code: "method_not_allowed",
                reason: format!("{method} is not served on {path}"),
            }),
            Some(route) => match route.call {
                Call::Limits => Ok(clients::limits(policy)),
                Call::Status => Ok(self.status_json(&runtime)),
                Call::Clients => {
                    let params = query_params(query.as_deref());
                    clients_call(&method, &params, policy, store, &peer, &mut who).await
                }
                Call::Credit => credit_call(session, policy, store, &peer, &mut who).await,
                Call::ApiKeys | Call::Import | Call::Overrides => {
                    let params = query_params(query.as_deref());
                    self.api_keys_call(session, route.call, &method, &params, &runtime, &peer)
                        .await
                }
            },
        };
        let status = result.as_ref().map_or_else(|e| e.status, |_| 200);
        // The client by its label: never a key, a cookie or a token in full.
        let who = who.map(|w| format!(" {w}")).unwrap_or_default();
        if path == "/v1/status" {
            debug!("admin: {method} {path} by {peer}: {status}");
        } else {
            info!("admin: {method} {path}{who} by {peer}: {status}");
        }
        match result {
            Ok(body) => json_reply(200, &body),
            Err(e) => {
                let mut response = error(&e);
                if let (405, Some(route)) = (e.status, route(&path)) {
                    response.headers_mut().insert(
                        http::header::ALLOW,
                        http::HeaderValue::from_static(route.allow),
                    );
                }
                response
            }
        }
    }

    /// `/v1/api_keys`, `/v1/api_keys/import` and `/v1/overrides`: every
    /// change is one log line (key labels, never a key) and counted.
    async fn api_keys_call(
        &self,
        session: &mut ServerSession,
        call: Call,
        method: &Method,
        params: &Params,
        runtime: &crate::server::state::Runtime,
        peer: &str,
    ) -> Result<Value, ApiError> {
        let policy = &runtime.policy;
        let Some(clients) = &self.state.clients else {
            return Err(ApiError::not_found(
                "run_time_clients_off",
                "run-time clients start with the admin API: restart with [admin].token_file set",
            ));
        };
        let now_s = unix_now();
        let changed = match (call, method.as_str()) {
            (Call::ApiKeys, "GET") => return api_keys::get(clients, policy, params),
            (Call::ApiKeys, "PUT") => {
                let body = read_body(session).await?;
                api_keys::put(clients, policy, &body, now_s).await?
            }
            (Call::ApiKeys, _) => api_keys::revoke(clients, policy, params, now_s).await?,
            (Call::Overrides, "GET") => return overrides::list(clients, policy, params, now_s),
            (Call::Overrides, "PUT") => {
                let body = read_body(session).await?;
                overrides::put(clients, policy, &runtime.override_rules, &body, now_s).await?
            }
            (Call::Overrides, _) => overrides::remove(clients, policy, params).await?,
            _ => {
                let body = read_body_up_to(session, MAX_IMPORT_BODY).await?;
                api_keys::import(clients, policy, &body, now_s).await?
            }
        };
        let (answer, changed) = changed;
        self.state
            .metrics
            .client_changes
            .with_label_values(&[changed.what])
            .inc();
        info!(
            "admin: {} {} in {} (by {peer})",
            changed.what,
            changed.detail,
            clients.kept_in()
        );
        Ok(answer)
    }

    fn status_json(&self, runtime: &crate::server::state::Runtime) -> Value {
        let state = &self.state;
        state.status.to_json(&Scene {
            deciding: state.store.deciding(),
            limits: runtime.limits().collect(),
            config: state.config_path.display().to_string(),
            store_target: state.store_target(),
            instances: state.instances.as_ref().map(|i| (i.get(), i.is_counted())),
            connections_open: state.metrics.connections.open.get(),
            in_flight: state.in_flight(),
            admin_connections_open: state.metrics.admin_connections.open.get(),
            protection: state.protection.snapshot(),
        })
    }

    /// `/`: the status page, or the login form.
    fn page(&self, session: &ServerSession) -> Response<Vec<u8>> {
        let runtime = self.state.runtime.load();
        let Some(token) = &runtime.admin_token else {
            return text(404, "the status page is off: set [admin].token_file\n");
        };
        match authenticate(token, &session.req_header().headers, unix_now()) {
            Some(_) => html(200, STATUS_PAGE, &[]),
            None => html(401, &LOGIN_PAGE.replace("<!--error-->", ""), &[]),
        }
    }

    /// `POST /login`: the token from the form, kept as an HttpOnly cookie.
    async fn login(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let runtime = self.state.runtime.load_full();
        let Some(token) = &runtime.admin_token else {
            return text(404, "the status page is off: set [admin].token_file\n");
        };
        if session.req_header().method != Method::POST {
            return text(405, "log in with the form at /\n");
        }
        let body = read_body(session).await.unwrap_or_default();
        let given = std::str::from_utf8(&body)
            .unwrap_or("")
            .split('&')
            .find_map(|pair| pair.strip_prefix("token="))
            .map(form_decode)
            .unwrap_or_default();
        if token.matches(given.trim_ascii()) {
            let cookie = format!(
                "{COOKIE_NAME}={}; Path=/; HttpOnly; SameSite=Strict; Max-Age={SESSION_S}",
                token.session(unix_now())
            );
            html(
                303,
                "<a href=\"/\">status</a>",
                &[("Location", "/"), ("Set-Cookie", &cookie)],
            )
        } else {
            let peer = session
                .client_addr()
                .map_or_else(|| "?".to_string(), |a| a.to_string());
            self.refusals
                .refused(|| format!("login from {peer} refused: wrong token"));
            html(
                401,
                &LOGIN_PAGE.replace(
                    "<!--error-->",
                    "<p class=\"error\">That is not the admin token.</p>",
                ),
                &[],
            )
        }
    }
}

/// What an API route does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    ApiKeys,
    Import,
    Overrides,
    Clients,
    Credit,
    Limits,
    Status,
}

/// One path of the API and the methods it serves (its `Allow` header).
struct Route {
    path: &'static str,
    allow: &'static str,
    call: Call,
}

/// The API, in one place: the dispatch, a 405's `Allow` and a 404's hint
/// all read it.
const ROUTES: [Route; 7] = [
    Route {
        path: "/v1/api_keys",
        allow: "GET, PUT, DELETE",
        call: Call::ApiKeys,
    },
    Route {
        path: "/v1/api_keys/import",
        allow: "POST",
        call: Call::Import,
    },
    Route {
        path: "/v1/overrides",
        allow: "GET, PUT, DELETE",
        call: Call::Overrides,
    },
    Route {
        path: "/v1/clients",
        allow: "GET, DELETE",
        call: Call::Clients,
    },
    Route {
        path: "/v1/clients/credit",
        allow: "POST",
        call: Call::Credit,
    },
    Route {
        path: "/v1/limits",
        allow: "GET",
        call: Call::Limits,
    },
    Route {
        path: "/v1/status",
        allow: "GET",
        call: Call::Status,
    },
];

fn route(path: &str) -> Option<&'static Route> {
    ROUTES.iter().find(|route| route.path == path)
}

impl Route {
    fn serves(&self, method: &Method) -> bool {
        self.allow.split(", ").any(|m| m == method.as_str())
    }
}

/// "/v1/clients, ... or /v1/status".
fn routes_hint() -> String {
    let paths: Vec<&str> = ROUTES.iter().map(|route| route.path).collect();
    match paths.split_last() {
        Some((last, [])) => (*last).to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// `GET` or `DELETE /v1/clients`; `who` is set to the client's label.
async fn clients_call(
    method: &Method,
    params: &Params,
    policy: &floodgate_policy::Policy,
    store: &dyn floodgate_limiter::Store,
    peer: &str,
    who: &mut Option<String>,
) -> Result<Value, ApiError> {
    let lookup = Lookup::from_params(policy, params)?;
    *who = Some(lookup.label.clone());
    let limit = param(params, "limit");
    if method == Method::GET {
        return clients::show(store, policy, &lookup, limit).await;
    }
    let done = clients::reset(store, policy, &lookup, limit).await?;
    info!(
        "admin: reset {} ({}) under {} on {} (by {peer})",
        lookup.label, lookup.tier, done["reset"], done["store"]
    );
    Ok(done)
}

/// `POST /v1/clients/credit`; `who` is set to the client's label.
async fn credit_call(
    session: &mut ServerSession,
    policy: &floodgate_policy::Policy,
    store: &dyn floodgate_limiter::Store,
    peer: &str,
    who: &mut Option<String>,
) -> Result<Value, ApiError> {
    let (params, units) = body_params(&read_body(session).await?)?;
    let lookup = Lookup::from_params(policy, &params)?;
    *who = Some(lookup.label.clone());
    let done = clients::credit(store, policy, &lookup, param(&params, "limit"), units).await?;
    info!(
        "admin: credited {} ({}) {} units under {} on {}: {} left, was {} (by {peer})",
        lookup.label,
        lookup.tier,
        done["units"],
        done["limit"],
        done["store"],
        done["remaining"],
        done["remaining_before"]
    );
    Ok(done)
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let path = session.req_header().uri.path().to_string();
        match path.as_str() {
            "/metrics" => {
                self.state.refresh_gauges();
                reply::reply(
                    200,
                    "text/plain; version=0.0.4",
                    self.state.metrics.render().into_bytes(),
                )
            }
            "/healthz" => text(200, "ok\n"),
            "/readyz" => {
                let (status, reason) = self.state.readiness();
                text(status, reason)
            }
            "/" => self.page(session),
            "/status.js" => reply::reply(
                200,
                "text/javascript; charset=utf-8",
                STATUS_SCRIPT.as_bytes().to_vec(),
            ),
            "/login" => self.login(session).await,
            p if p == "/v1" || p.starts_with("/v1/") => self.api(session).await,
            _ => text(
                404,
                "not found: try /metrics, /healthz, /readyz, / (status page) or /v1/\n",
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_is_found_by_its_path_and_serves_what_it_allows() {
        for r in &ROUTES {
            let found = route(r.path).expect("found by its path");
            assert_eq!(found.call, r.call);
            for method in r.allow.split(", ") {
                let method = Method::from_bytes(method.as_bytes()).expect("a method");
                assert!(r.serves(&method), "{} {}", method, r.path);
            }
            assert!(http::HeaderValue::from_str(r.allow).is_ok());
        }
        assert!(route("/v1/clients/").is_none());
        assert!(!route("/v1/clients").expect("a route").serves(&Method::PUT));
        assert!(!route("/v1/clients/credit")
            .expect("a route")
            .serves(&Method::GET));
    }

    #[test]
    fn the_hint_names_every_route() {
        assert_eq!(
            routes_hint(),
            "/v1/api_keys, /v1/api_keys/import, /v1/overrides, /v1/clients, /v1/clients/credit, /v1/limits or /v1/status"
        );
    }
}
