//! Handlers of the operations routes: health, readiness, metrics, OpenAPI, the test-only fault
//! knobs.
//!
//! Must not depend on: the node's internals (only the request path's `Service`).

use super::*;

pub(super) async fn healthz(State(state): State<AppState>) -> Response {
    axum::Json(serde_json::json!({
        "status": "ok",
        "node_id": state.backend().node_id(),
    }))
    .into_response()
}

/// The node's fault knobs, or the 404 every unknown route gets.
pub(super) fn fault_controls_of(
    state: &AppState,
    method: Method,
) -> Result<Arc<FaultControls>, ApiError> {
    state.backend().fault_controls().ok_or_else(|| {
        ApiError::new(
            ErrorCode::NotFound,
            format!("no route for {method} {TESTING_FAULTS_PATH}"),
        )
    })
}

// `/testing/*` answers only authenticated callers (the `Caller` extractor: a bearer token, or in
// insecure development mode the principal headers), as every lease route does.
pub(super) async fn testing_faults(
    State(state): State<AppState>,
    _caller: Caller,
) -> Result<Response, ApiError> {
    let controls = fault_controls_of(&state, Method::GET)?;
    Ok(axum::Json(controls.state()).into_response())
}

pub(super) async fn set_testing_faults(
    State(state): State<AppState>,
    _caller: Caller,
    BodyBytes(body): BodyBytes,
) -> Result<Response, ApiError> {
    let controls = fault_controls_of(&state, Method::POST)?;
    let settings: FaultSettings = serde_json::from_slice(&body).map_err(|error| {
        ApiError::new(
            ErrorCode::InvalidArgument,
            format!("fault settings: {error}"),
        )
    })?;
    let applied = controls
        .apply(&settings)
        .map_err(|error| ApiError::new(ErrorCode::InvalidArgument, error))?;
    tracing::warn!(?settings, "fault injection changed");
    Ok(axum::Json(applied).into_response())
}

pub(super) async fn readyz(State(state): State<AppState>) -> Response {
    let readiness = state.backend().readiness();
    let status = if readiness.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(readiness)).into_response()
}

pub(super) async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)],
        state.backend().render_metrics(),
    )
        .into_response()
}

pub(super) async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON).into_response()
}
