//! Continuing an answer from its start. A run lost after saving its text
//! ([`crate::tasks::checkpoint`]) leaves that text on the record; the run that takes the task over
//! asks for the rest only, the saved text sent as the start of the assistant's turn (Anthropic's
//! prefill; an OpenAI-compatible server that continues a final assistant message, as vLLM's
//! `continue_final_message` does). The provider bills the prefix as prompt, not as completion.
//!
//! [`Continuing`] wraps one route's client, so the adapters only write the prefix into their
//! request bodies and every layer above sees a whole answer:
//!
//! - a client that cannot continue is asked for the whole answer (the prefix dropped);
//! - one that can gets the prefix; its sink is given the prefix with the first of the rest, then
//!   the rest as it comes, and the answer's text is the two, with [`LlmResponse::continued`] set to
//!   the prefix's tokens;
//! - a continued call that the provider refuses as a request (a model that takes no prefill answers
//!   400) is made again whole, the sink told to restart; when that whole call is answered, the
//!   route is not asked to continue again in this process.

use crate::ports::{DeltaSink, LlmClient, LlmError, LlmRequest, LlmResponse};
use async_trait::async_trait;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// One route's client, continuing answers where its provider can.
pub struct Continuing {
    inner: Arc<dyn LlmClient>,
    /// The provider takes a prefix, and has not refused one.
    continues: AtomicBool,
}

impl Continuing {
    /// `inner`, asked to continue prefixes when `continues`.
    pub fn new(inner: Arc<dyn LlmClient>, continues: bool) -> Self {
        Self { inner, continues: AtomicBool::new(continues) }
    }

    async fn call(
        &self,
        request: &LlmRequest,
        sink: Option<&dyn DeltaSink>,
    ) -> Result<LlmResponse, LlmError> {
        let continued = request.continuation().filter(|_| self.continues.load(Ordering::Relaxed));
        let Some((prefix, _)) = continued else {
            // Almost every call has no prefix: passed on as it is, not copied.
            return match request.prefix {
                None => self.inner.call(request, sink).await,
                Some(_) => self.inner.call(&request.whole(), sink).await,
            };
        };
        let prefixed = sink.map(|sink| Prefixed { sink, prefix, said: AtomicBool::new(false) });
        match self.inner.call(request, prefixed.as_ref().map(|p| p as &dyn DeltaSink)).await {
            Ok(mut answer) => {
                if let Some(p) = prefixed.as_ref().filter(|p| !p.said.load(Ordering::Relaxed)) {
                    p.sink.delta(prefix);
                }
                answer.text.insert_str(0, prefix);
                answer.continued = request.prefix.as_ref().map_or(0, |p| u64::from(p.tokens));
                Ok(answer)
            }
            Err(LlmError::Permanent(why)) => {
                if let Some(sink) = sink {
                    sink.restart("the provider does not continue an answer; it starts again");
                }
                let whole = self.inner.call(&request.whole(), sink).await?;
                tracing::warn!(why = %why, "the provider refused to continue a prefix; this route answers whole from now on");
                self.continues.store(false, Ordering::Relaxed);
                Ok(whole)
            }
            Err(e) => Err(e),
        }
    }
}

/// The caller's sink for a continued call: the prefix goes first, with the call's first text, not
/// before it. A layer that calls again when no text went out (a refused tier, a 429 before the
/// first byte) tells the sink nothing, so a prefix given up front would be given twice.
struct Prefixed<'a> {
    sink: &'a dyn DeltaSink,
    prefix: &'a str,
    /// Whether the prefix went out since the last restart.
    said: AtomicBool,
}

impl DeltaSink for Prefixed<'_> {
    fn delta(&self, text: &str) {
        if !self.said.swap(true, Ordering::Relaxed) {
            self.sink.delta(self.prefix);
        }
        self.sink.delta(text);
    }

    fn restart(&self, reason: &str) {
        self.said.store(false, Ordering::Relaxed);
        self.sink.restart(reason);
    }
}

#[async_trait]
impl LlmClient for Continuing {
    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
        self.call(request, None).await
    }

    async fn stream(&self, request: &LlmRequest, sink: &dyn DeltaSink) -> Result<LlmResponse, LlmError> {
        self.call(request, Some(sink)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::model_call::Prefix;
    use crate::domain::{Kind, Lane};
    use std::sync::Mutex;

    /// A provider that continues what it is given with " world", or refuses any prefix; it records
    /// the prefixes it was sent.
    struct Model {
        refuses: bool,
        sent: Mutex<Vec<Option<String>>>,
        /// Fails its next call before any text (a refused tier, a 429 before the first byte).
        fails: std::sync::atomic::AtomicBool,
    }

    #[async_trait]
    impl LlmClient for Model {
        async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
            let prefix = request.continuation().map(|(p, _)| p.to_owned());
            self.sent.lock().unwrap_or_else(|e| e.into_inner()).push(prefix.clone());
            if self.refuses && prefix.is_some() {
                return Err(LlmError::Permanent("400: prefill is not supported".into()));
            }
            if self.fails.swap(false, Ordering::Relaxed) {
                return Err(LlmError::TierRefused { message: "no flex capacity".into(), unsupported: false });
            }
            let text = if prefix.is_some() { " world" } else { "hello world" };
            Ok(LlmResponse {
                text: text.into(),
                model: "m".into(),
                usage: Default::default(),
                truncated: false,
                limits: Default::default(),
                tier: Default::default(),
                route: Default::default(),
                continued: 0,
            })
        }
    }

    #[derive(Default)]
    struct Shown(Mutex<String>);
    impl DeltaSink for Shown {
        fn delta(&self, text: &str) {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).push_str(text);
        }
        fn restart(&self, _: &str) {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }

    fn request(prefix: &str) -> LlmRequest {
        LlmRequest {
            lane: Lane::Synthesis,
            kind: Kind::Scaffold,
            prompt: "p".into(),
            target_files: vec![],
            max_tokens: 100,
            params: Default::default(),
            tier: Default::default(),
            prefix: Some(Prefix { text: prefix.into(), tokens: 1 }),
        }
    }

    fn model(refuses: bool) -> Arc<Model> {
        Arc::new(Model { refuses, sent: Mutex::new(vec![]), fails: AtomicBool::new(false) })
    }

    #[tokio::test]
    async fn a_continued_answer_is_the_prefix_then_the_rest_and_says_what_it_saved() {
        let inner = model(false);
        let client = Continuing::new(inner.clone(), true);
        let shown = Shown::default();
        let answer = client.stream(&request("hello \n"), &shown).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((answer.text.as_str(), answer.continued), ("hello world", 1));
        assert_eq!(*shown.0.lock().unwrap_or_else(|e| e.into_inner()), "hello world");
        assert_eq!(*inner.sent.lock().unwrap_or_else(|e| e.into_inner()), [Some("hello".to_owned())]);
    }

    /// A layer above that calls again after a failure before any text tells the sink nothing: the
    /// prefix must not have gone out with the failed call.
    #[tokio::test]
    async fn a_call_made_again_before_any_text_gives_the_prefix_once() {
        let inner = model(false);
        inner.fails.store(true, Ordering::Relaxed);
        let client = Continuing::new(inner.clone(), true);
        let shown = Shown::default();
        assert!(client.stream(&request("hello"), &shown).await.is_err());
        let answer = client.stream(&request("hello"), &shown).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(answer.text, "hello world");
        assert_eq!(*shown.0.lock().unwrap_or_else(|e| e.into_inner()), "hello world");
    }

    #[tokio::test]
    async fn a_route_that_cannot_continue_is_asked_for_the_whole_answer() {
        let inner = model(false);
        let answer = Continuing::new(inner.clone(), false).complete(&request("hello")).await;
        let answer = answer.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((answer.text.as_str(), answer.continued), ("hello world", 0));
        assert_eq!(*inner.sent.lock().unwrap_or_else(|e| e.into_inner()), [None]);
    }

    #[tokio::test]
    async fn a_refused_prefix_is_asked_again_whole_and_not_again_after() {
        let inner = model(true);
        let client = Continuing::new(inner.clone(), true);
        let shown = Shown::default();
        let answer = client.stream(&request("hello"), &shown).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((answer.text.as_str(), answer.continued), ("hello world", 0));
        assert_eq!(*shown.0.lock().unwrap_or_else(|e| e.into_inner()), "hello world", "the prefix voided");
        client.complete(&request("hello")).await.unwrap_or_else(|e| panic!("{e}"));
        let sent = inner.sent.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert_eq!(sent, [Some("hello".to_owned()), None, None]);
    }

    #[tokio::test]
    async fn a_prefix_as_long_as_the_cap_is_not_continued() {
        let inner = model(false);
        let mut full = request("hello");
        full.prefix = Some(Prefix { text: "hello".into(), tokens: 100 });
        Continuing::new(inner.clone(), true).complete(&full).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(*inner.sent.lock().unwrap_or_else(|e| e.into_inner()), [None]);
    }
}
