//! Configuration of the Elasticsearch store: the command-line flags (each
//! also an environment variable) and the validated value the store is built from.
//! Secrets never appear in `Debug` output, hence in no log line.

use std::fmt;
use std::time::Duration;

use super::request::IndexNames;
use super::retry::Backoff;

/// Flags that select and configure the Elasticsearch store.
#[derive(Clone, clap::Args)]
pub struct ElasticsearchArgs {
    /// Elasticsearch URL (e.g. http://localhost:9200). When given, counters are
    /// stored in Elasticsearch instead of the embedded store.
    #[arg(long = "elasticsearch-url", env = "COUNTER_GATEWAY_ELASTICSEARCH_URL")]
    pub url: Option<String>,

    /// User name for basic authentication.
    #[arg(
        long = "elasticsearch-username",
        env = "COUNTER_GATEWAY_ELASTICSEARCH_USERNAME",
        requires = "password"
    )]
    pub username: Option<String>,

    /// Password for basic authentication (never logged).
    #[arg(
        long = "elasticsearch-password",
        env = "COUNTER_GATEWAY_ELASTICSEARCH_PASSWORD",
        hide_env_values = true,
        requires = "username"
    )]
    pub password: Option<String>,

    /// API key, base64 `id:key` as Elasticsearch encodes it (never logged).
    #[arg(
        long = "elasticsearch-api-key",
        env = "COUNTER_GATEWAY_ELASTICSEARCH_API_KEY",
        hide_env_values = true,
        conflicts_with = "username"
    )]
    pub api_key: Option<String>,

    /// First part of every index name: `<prefix>_<tenant>_<collection>`.
    #[arg(
        long,
        env = "COUNTER_GATEWAY_INDEX_PREFIX",
        default_value = "counter-gateway"
    )]
    pub index_prefix: String,

    /// Do not install index templates and stored scripts at start-up
    /// (run `counter-gateway setup` beforehand instead).
    #[arg(long, env = "COUNTER_GATEWAY_SKIP_SETUP")]
    pub skip_setup: bool,
}

impl fmt::Debug for ElasticsearchArgs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ElasticsearchArgs")
            .field("url", &self.url)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("index_prefix", &self.index_prefix)
            .field("skip_setup", &self.skip_setup)
            .finish()
    }
}

/// The `setup` subcommand: install templates and scripts, then exit.
#[derive(Debug, Clone, clap::Args)]
pub struct SetupArgs {
    #[command(flatten)]
    pub elasticsearch: ElasticsearchArgs,

    /// Kibana URL (e.g. http://localhost:5601): also import the data views
    /// and the dashboard of `index-templates/kibana/` there, for
    /// `--index-prefix`, replacing earlier copies. Kibana is called with the
    /// Elasticsearch credentials given. Without --elasticsearch-url, only
    /// this import runs.
    #[arg(long, env = "COUNTER_GATEWAY_KIBANA_URL")]
    pub kibana_url: Option<String>,
}

impl ElasticsearchArgs {
    /// The credentials given, whether or not a URL selects Elasticsearch.
    pub fn auth(&self) -> Option<Auth> {
        match (&self.username, &self.password, &self.api_key) {
            (Some(u), Some(p), _) => Some(Auth::Basic {
                username: u.clone(),
                password: p.clone(),
            }),
            (_, _, Some(k)) => Some(Auth::ApiKey(k.clone())),
            _ => None,
        }
    }
}

/// How the store authenticates.
#[derive(Clone)]
pub enum Auth {
    Basic { username: String, password: String },
    ApiKey(String),
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Auth::Basic { username, .. } => write!(f, "Basic({username}, <redacted>)"),
            Auth::ApiKey(_) => write!(f, "ApiKey(<redacted>)"),
        }
    }
}

/// Everything the Elasticsearch store needs, validated.
#[derive(Clone, Debug)]
pub struct EsConfig {
    pub url: String,
    pub auth: Option<Auth>,
    pub names: IndexNames,
    pub backoff: Backoff,
    /// Timeout of one HTTP request to Elasticsearch.
    pub request_timeout: Duration,
    /// Shard-side re-runs of a script after a version conflict (two gateways
    /// on one document); increments commute, so re-running is safe.
    pub retry_on_conflict: u32,
    /// How long an event id is remembered.
    pub id_window: Duration,
    /// Most event ids remembered per document (oldest forgotten first).
    pub max_ids_per_doc: u32,
}

/// The tenant every index belongs to until tenants come.
pub const DEFAULT_TENANT: &str = "default";

impl EsConfig {
    /// A configuration with the defaults, for `url` and `prefix`.
    pub fn new(url: &str, prefix: &str, tenant: &str) -> Result<Self, String> {
        let mut parsed = url
            .parse::<elasticsearch::http::Url>()
            .map_err(|_| "--elasticsearch-url is not a URL".to_string())?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(format!(
                "--elasticsearch-url must start with http:// or https://, got {}://",
                parsed.scheme()
            ));
        }
        // Credentials written into the URL become basic auth, so the URL
        // itself can be logged.
        let auth = match (parsed.username(), parsed.password()) {
            ("", None) => None,
            (user, password) => Some(Auth::Basic {
                username: user.to_string(),
                password: password.unwrap_or("").to_string(),
            }),
        };
        let _ = parsed.set_username("");
        let _ = parsed.set_password(None);
        Ok(EsConfig {
            url: parsed.to_string(),
            auth,
            names: IndexNames::new(prefix, tenant).map_err(|e| format!("--index-prefix: {e}"))?,
            backoff: Backoff::standard(),
            request_timeout: Duration::from_secs(30),
            retry_on_conflict: 5,
            id_window: Duration::from_secs(7 * 86_400),
            max_ids_per_doc: 10_000,
        })
    }
}

impl ElasticsearchArgs {
    /// The store configuration, or `None` when no URL selects Elasticsearch.
    pub fn to_config(&self, id_window: Duration) -> Result<Option<EsConfig>, String> {
        let Some(url) = &self.url else {
            return Ok(None);
        };
        let mut c = EsConfig::new(url, &self.index_prefix, DEFAULT_TENANT)?;
        c.id_window = id_window;
        let from_url = c.auth.take();
        c.auth = match (&self.username, &self.password, &self.api_key) {
            (Some(u), Some(p), None) => Some(Auth::Basic {
                username: u.clone(),
                password: p.clone(),
            }),
            (None, None, Some(k)) => Some(Auth::ApiKey(k.clone())),
            (None, None, None) => from_url,
            _ => {
                return Err(
                    "give either --elasticsearch-username with --elasticsearch-password, or --elasticsearch-api-key"
                        .into(),
                )
            }
        };
        Ok(Some(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_not_in_debug_output() {
        let a = ElasticsearchArgs {
            url: Some("http://localhost:9200".into()),
            username: Some("elastic".into()),
            password: Some("hunter2".into()),
            api_key: None,
            index_prefix: "counter-gateway".into(),
            skip_setup: false,
        };
        let c = a.to_config(Duration::from_secs(1)).unwrap().unwrap();
        let shown = format!("{a:?} {c:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("elastic"));
    }

    #[test]
    fn credentials_in_the_url_become_basic_auth() {
        let c = EsConfig::new("https://elastic:hunter2@es.example:9200", "cg", "default").unwrap();
        assert_eq!(c.url, "https://es.example:9200/");
        assert!(
            matches!(c.auth, Some(Auth::Basic { ref username, ref password }) if username == "elastic" && password == "hunter2")
        );
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    #[test]
    fn bad_urls_and_prefixes_are_refused() {
        assert!(EsConfig::new("localhost:9200", "cg", "default").is_err());
        assert!(EsConfig::new("ftp://x", "cg", "default").is_err());
        assert!(EsConfig::new("http://x:9200", "CG", "default")
            .unwrap_err()
            .contains("--index-prefix"));
    }
}
