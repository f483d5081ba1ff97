//! Picks the language model and the embedder from configuration: an
//! OpenAI-compatible endpoint when a base URL is given, the offline,
//! deterministic pair otherwise.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use parlance_memory::{HashingEmbedder, OfflineLlm};
use parlance_openai::{ApiSecret, OpenAiClient, OpenAiConfig, OpenAiEmbedder};
use parlance_ports::{EmbeddingProvider, LlmClient};

use crate::config::{LlmConfig, setting_for};

/// The model and embedder the service uses.
pub struct Models {
    /// The chat model.
    pub llm: Arc<dyn LlmClient>,
    /// The embedder.
    pub embedder: Arc<dyn EmbeddingProvider>,
}

/// The offline model of the embedded default: deterministic, with the
/// conversation agent's hand-off rule
/// ([`offline_hand_off`](crate::conversation::offline_hand_off)).
pub fn offline_llm() -> OfflineLlm {
    let llm = OfflineLlm::new();
    llm.add_rule(crate::conversation::offline_hand_off());
    llm
}

impl Models {
    /// The offline model ([`offline_llm`]) and the feature-hashing embedder.
    pub fn offline() -> Self {
        Self {
            llm: Arc::new(offline_llm()),
            embedder: Arc::new(HashingEmbedder::default()),
        }
    }

    /// Builds them from `config`, reading the API key from the environment
    /// variable it names.
    ///
    /// # Errors
    ///
    /// A base URL without a model, an embedding model without a base URL,
    /// or a base URL or key that cannot be used.
    pub fn from_config(config: &LlmConfig) -> anyhow::Result<Self> {
        Self::from_config_with(config, |name| std::env::var(name).ok())
    }

    /// Like [`from_config`](Self::from_config), with `env` looking up
    /// environment variables.
    ///
    /// # Errors
    ///
    /// As [`from_config`](Self::from_config).
    pub fn from_config_with(
        config: &LlmConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Self> {
        let Some(base_url) = config.base_url.as_deref().filter(|u| !u.trim().is_empty()) else {
            if config.embedding_model.is_some() {
                bail!(
                    "{} needs {}",
                    setting_for("llm.embedding_model").spellings(),
                    setting_for("llm.base_url").spellings()
                );
            }
            return Ok(Self::offline());
        };
        let model = config
            .model
            .as_deref()
            .filter(|m| !m.trim().is_empty())
            .with_context(|| {
                format!(
                    "{} is required with {}",
                    setting_for("llm.model").spellings(),
                    setting_for("llm.base_url").spellings()
                )
            })?;
        let mut endpoint = OpenAiConfig::new(base_url.trim(), model.trim())
            .with_timeout(Duration::from_secs(config.timeout_secs.max(1)));
        match env(&config.api_key_env).filter(|k| !k.trim().is_empty()) {
            Some(key) => endpoint = endpoint.with_api_key(ApiSecret::new(key.trim())),
            None => tracing::info!(
                variable = %config.api_key_env,
                "no API key in the environment; calling the model without one"
            ),
        }
        let llm = OpenAiClient::new(endpoint.clone())
            .with_context(|| setting_for("llm.base_url").spellings())?;
        let embedder: Arc<dyn EmbeddingProvider> = match &config.embedding_model {
            Some(m) => Arc::new(
                OpenAiEmbedder::new(endpoint, m.trim(), None).context("configure the embedder")?,
            ),
            None => Arc::new(HashingEmbedder::default()),
        };
        Ok(Self {
            llm: Arc::new(llm),
            embedder,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn offline_without_a_base_url() {
        let m = Models::from_config_with(&LlmConfig::default(), no_env).unwrap();
        assert!(m.llm.describe().starts_with("offline"));
        assert_eq!(m.llm.default_model(), "offline");
        assert_eq!(m.embedder.model(), "feature-hash-256");
    }

    #[tokio::test]
    async fn the_offline_model_hands_over_only_when_it_may_and_is_asked() {
        use parlance_ports::{CompletionRequest, Message, ToolChoice, ToolDefinition};
        let llm = Models::offline().llm;
        let tool = |name: &str| ToolDefinition {
            name: name.into(),
            description: name.into(),
            parameters: serde_json::json!({"type": "object", "properties": {"text": {"type": "string"}}}),
        };
        let ask = |tools: &[&str], text: &str| {
            let mut r = CompletionRequest::new(vec![Message::system("talk"), Message::user(text)])
                .with_tools(tools.iter().map(|t| tool(t)).collect());
            r.tool_choice = Some(ToolChoice::Required);
            r
        };
        let called = |r: CompletionRequest| {
            let llm = llm.clone();
            async move { llm.complete(&r).await.unwrap().tool_calls[0].name.clone() }
        };
        let both = ["send_message", "request_human"];
        assert_eq!(
            called(ask(&both, "a person, please")).await,
            "request_human"
        );
        assert_eq!(
            called(ask(&both, "Any HUMAN there?")).await,
            "request_human"
        );
        assert_eq!(called(ask(&both, "Tuesday")).await, "send_message");
        assert_eq!(
            called(ask(&["send_message"], "a person!")).await,
            "send_message"
        );
    }

    #[test]
    fn an_endpoint_with_a_key_from_the_named_variable() {
        let c = LlmConfig {
            base_url: Some("http://127.0.0.1:11434/v1".into()),
            model: Some("llama3.1".into()),
            api_key_env: "MY_KEY".into(),
            embedding_model: Some("nomic-embed-text".into()),
            ..LlmConfig::default()
        };
        let asked = std::sync::Mutex::new(Vec::new());
        let m = Models::from_config_with(&c, |name| {
            asked.lock().unwrap().push(name.to_owned());
            Some("sk-from-env".into())
        })
        .unwrap();
        assert_eq!(*asked.lock().unwrap(), ["MY_KEY"]);
        assert_eq!(
            m.llm.describe(),
            "openai-compatible endpoint http://127.0.0.1:11434/v1"
        );
        assert_eq!(m.llm.default_model(), "llama3.1");
        assert_eq!(m.embedder.model(), "nomic-embed-text");
        assert!(!format!("{:?}", m.llm).contains("sk-from-env"));
    }

    #[test]
    fn incomplete_settings_are_refused() {
        let c = LlmConfig {
            base_url: Some("https://api.openai.com/v1".into()),
            ..LlmConfig::default()
        };
        let e = Models::from_config_with(&c, no_env).err().unwrap();
        assert_eq!(
            e.to_string(),
            "`llm.model`, $PARLANCE_LLM_MODEL, --llm-model is required with \
             `llm.base_url`, $PARLANCE_LLM_BASE_URL, --llm-base-url"
        );
        let c = LlmConfig {
            embedding_model: Some("text-embedding-3-small".into()),
            ..LlmConfig::default()
        };
        assert!(Models::from_config_with(&c, no_env).is_err());
        let c = LlmConfig {
            base_url: Some("not a url".into()),
            model: Some("m".into()),
            ..LlmConfig::default()
        };
        assert!(Models::from_config_with(&c, no_env).is_err());
    }
}
