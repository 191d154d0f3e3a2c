//! The spans of a request's way through the engine, for traces.
//!
//! Every span is `tracing`'s, at TRACE level under one target, [`TARGET`]: the binary
//! exports that target (and only it) as OpenTelemetry spans when OTLP is configured, and
//! the logs' filter leaves it out, so with tracing off a span costs one check of the
//! global level. Spans are made only under a request's span: a video frame, which has
//! none, starts no trace of its own, and neither does a warm-up batch.
//!
//! The tree, as text-generation-inference draws it: the request's span has `admission`,
//! `decode`, `queue` and `infer` as children; a batch is a root span of its own,
//! `batch`, with `preprocess`, `inference` and `postprocess` as its children, linked to
//! each request's `infer` span and they to it.

use tracing::Span;

/// The target of every span made for traces, here and in the api crate.
pub const TARGET: &str = "peregrine::trace";

/// A span for traces under `parent`, or no span at all when tracing is off or `parent`
/// is disabled (a request nobody traces). The level is checked first, so that with
/// tracing off `parent` is not even evaluated.
macro_rules! trace_span {
    ($parent:expr, $name:literal $(, $($fields:tt)*)?) => {{
        if !::tracing::level_enabled!(::tracing::Level::TRACE) {
            ::tracing::Span::none()
        } else {
            let parent: &::tracing::Span = $parent;
            if parent.is_disabled() {
                ::tracing::Span::none()
            } else {
                ::tracing::span!(
                    target: $crate::spans::TARGET,
                    parent: parent,
                    ::tracing::Level::TRACE,
                    $name
                    $(, $($fields)*)?
                )
            }
        }
    }};
}

/// The caller's span, to make the request's spans under: none while tracing is off, so
/// that an untraced request clones no span (the log's own spans included).
pub(crate) fn current_request() -> Span {
    if tracing::level_enabled!(tracing::Level::TRACE) {
        Span::current()
    } else {
        Span::none()
    }
}

/// Taking an admission permit, under the caller's current span.
pub(crate) fn admission() -> Span {
    trace_span!(&Span::current(), "admission")
}

/// Decoding and letterboxing one image on the preprocessing pool, under `request`.
pub(crate) fn decode(request: &Span, model: &str, version: &str) -> Span {
    trace_span!(request, "decode", model = model, version = version)
}

/// A request's wait in the batch queue, from its arrival there to its batch's start.
pub(crate) fn queue(request: &Span, model: &str, version: &str) -> Span {
    trace_span!(request, "queue", model = model, version = version)
}

/// The batch, a root span of its own, when at least one of its requests is traced.
pub(crate) fn batch<'a>(
    requests: impl IntoIterator<Item = &'a Span>,
    model: &str,
    version: &str,
    size: usize,
) -> Span {
    // Requests carry a disabled span whenever tracing is off (`current_request`).
    if requests.into_iter().all(Span::is_disabled) {
        return Span::none();
    }
    tracing::span!(
        target: TARGET,
        parent: None,
        tracing::Level::TRACE,
        "batch",
        model = model,
        version = version,
        batch_size = size as i64
    )
}

/// One request's part in a batch: its child, linked to the batch's span both ways.
pub(crate) fn infer(request: &Span, batch: &Span, model: &str, version: &str, size: usize) -> Span {
    let span = trace_span!(
        request,
        "infer",
        model = model,
        version = version,
        batch_size = size as i64
    );
    if !span.is_disabled() && !batch.is_disabled() {
        span.follows_from(batch);
        batch.follows_from(&span);
    }
    span
}

/// A stage of the batch running now (`preprocess`, `inference` or `postprocess`), under
/// the current span: the batch's, on an instance thread.
pub(crate) fn stage(name: Stage) -> Span {
    match name {
        Stage::Preprocess => trace_span!(&Span::current(), "preprocess"),
        Stage::Inference => trace_span!(&Span::current(), "inference"),
        Stage::Postprocess => trace_span!(&Span::current(), "postprocess"),
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Stage {
    Preprocess,
    Inference,
    Postprocess,
}
