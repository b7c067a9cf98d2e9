//! Configuration of the Elasticsearch store: the command-line flags (each
//! also an environment variable) and the validated value the store is built from.
//! Secrets never appear in `Debug` output, hence in no log line.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use elasticsearch::cert::{Certificate, CertificateValidation};
use elasticsearch::http::transport::{SingleNodeConnectionPool, TransportBuilder};

use super::request::IndexNames;
use super::retry::Backoff;

/// Flags that select and configure the Elasticsearch store.
#[derive(Clone, clap::Args)]
pub struct ElasticsearchArgs {
    /// Elasticsearch URL (e.g. http://localhost:9200). When given, counters are
    /// stored in Elasticsearch instead of the embedded store. Several nodes:
    /// repeat the flag or separate URLs with commas; requests take turns over
    /// the nodes that answer, and one whose connection fails is set aside.
    #[arg(
        long = "elasticsearch-url",
        env = "COUNTER_GATEWAY_ELASTICSEARCH_URL",
        value_delimiter = ','
    )]
    pub url: Vec<String>,

    /// Also use the cluster's other nodes: ask it for them (`GET _nodes/http`,
    /// each node's published HTTP address) at start, every 5 minutes and
    /// soon after a node fails. The URLs given are always kept.
    #[arg(
        long = "elasticsearch-sniff",
        env = "COUNTER_GATEWAY_ELASTICSEARCH_SNIFF"
    )]
    pub sniff: bool,

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

    /// PEM file of the CA that signed the cluster's certificate (one or more
    /// certificates), trusted besides the public roots: a default secured
    /// Elasticsearch 8 serves a certificate of its own self-signed CA.
    #[arg(
        long = "elasticsearch-ca-cert",
        env = "COUNTER_GATEWAY_ELASTICSEARCH_CA_CERT"
    )]
    pub ca_cert: Option<PathBuf>,

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

    /// Most `_bulk` requests of one tenant's writes in flight at once, no
    /// counter in two of them; 1 sends one at a time.
    #[arg(
        long = "elasticsearch-bulks-in-flight",
        env = "COUNTER_GATEWAY_ELASTICSEARCH_BULKS_IN_FLIGHT",
        default_value_t = DEFAULT_BULKS_IN_FLIGHT,
        value_parser = clap::value_parser!(u16).range(1..=64)
    )]
    pub bulks_in_flight: u16,
}

/// Default of `--elasticsearch-bulks-in-flight`: one at a time, since more
/// measured no faster on a node whose CPU is the limit (scripts/bench/README.md).
pub const DEFAULT_BULKS_IN_FLIGHT: u16 = 1;

impl fmt::Debug for ElasticsearchArgs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ElasticsearchArgs")
            .field("url", &self.url)
            .field("sniff", &self.sniff)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("ca_cert", &self.ca_cert)
            .field("index_prefix", &self.index_prefix)
            .field("skip_setup", &self.skip_setup)
            .field("bulks_in_flight", &self.bulks_in_flight)
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

/// A CA certificate to trust, read and checked at start-up.
#[derive(Clone)]
pub struct CaCert {
    pub path: PathBuf,
    pem: Vec<u8>,
}

impl fmt::Debug for CaCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CaCert({})", self.path.display())
    }
}

impl CaCert {
    /// Reads `path` and checks that it holds PEM certificates the TLS
    /// client accepts, so a bad file stops the start, naming the flag,
    /// instead of failing every request.
    pub fn read(path: &Path) -> Result<CaCert, String> {
        let flag = "--elasticsearch-ca-cert";
        let pem = std::fs::read(path)
            .map_err(|e| format!("{flag} {}: cannot read it: {e}", path.display()))?;
        let cert = CaCert {
            path: path.to_path_buf(),
            pem,
        };
        // The PEM blocks are only decoded when a client is built: build one
        // (no I/O) to find out now.
        let url =
            elasticsearch::http::Url::parse("https://localhost:9200").map_err(|e| e.to_string())?;
        TransportBuilder::new(SingleNodeConnectionPool::new(url))
            .cert_validation(cert.validation()?)
            .build()
            .map_err(|e| {
                format!(
                    "{flag} {}: not a PEM CA certificate the TLS client accepts: {e}",
                    path.display()
                )
            })?;
        Ok(cert)
    }

    /// Full validation (chain and host name) against this CA.
    pub fn validation(&self) -> Result<CertificateValidation, String> {
        let chain = Certificate::from_pem(&self.pem).map_err(|e| {
            format!(
                "--elasticsearch-ca-cert {}: not a PEM certificate: {e}",
                self.path.display()
            )
        })?;
        Ok(CertificateValidation::Full(chain))
    }
}

/// Everything the Elasticsearch store needs, validated.
#[derive(Clone, Debug)]
pub struct EsConfig {
    /// The nodes' URLs, credentials taken out; at least one.
    pub urls: Vec<String>,
    /// Ask the cluster for its nodes (`--elasticsearch-sniff`).
    pub sniff: bool,
    pub auth: Option<Auth>,
    /// A private CA to trust (`--elasticsearch-ca-cert`).
    pub ca_cert: Option<CaCert>,
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
    /// Most bulks of one tenant in flight at once (`--elasticsearch-bulks-in-flight`).
    pub bulks_in_flight: usize,
    /// How many days hour buckets are kept (`--hourly-retention-days`):
    /// increments of older days write no hour document, and the gateway
    /// deletes hour indices past it.
    pub hourly_retention_days: u32,
}

/// One node's URL, checked, and the credentials written into it, taken out.
fn parse_url(url: &str) -> Result<(String, Option<Auth>), String> {
    let mut parsed = url
        .parse::<elasticsearch::http::Url>()
        .map_err(|_| format!("--elasticsearch-url {url:?} is not a URL"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!(
            "--elasticsearch-url must start with http:// or https://, got {}://",
            parsed.scheme()
        ));
    }
    if parsed.host().is_none() {
        return Err(format!("--elasticsearch-url {url:?} names no host"));
    }
    let auth = match (parsed.username(), parsed.password()) {
        ("", None) => None,
        (user, password) => Some(Auth::Basic {
            username: user.to_string(),
            password: password.unwrap_or("").to_string(),
        }),
    };
    let _ = parsed.set_username("");
    let _ = parsed.set_password(None);
    Ok((parsed.to_string(), auth))
}

/// The tenant every index belongs to until tenants come.
pub const DEFAULT_TENANT: &str = "default";

impl EsConfig {
    /// A configuration with the defaults, for `urls` (one or more, separated
    /// by commas) and `prefix`.
    pub fn new(urls: &str, prefix: &str, tenant: &str) -> Result<Self, String> {
        let list: Vec<&str> = urls.split(',').collect();
        Self::with_urls(&list, prefix, tenant)
    }

    /// A configuration with the defaults, for the nodes `urls`.
    pub fn with_urls(urls: &[&str], prefix: &str, tenant: &str) -> Result<Self, String> {
        let mut parsed = Vec::with_capacity(urls.len());
        let mut auth = None;
        for url in urls.iter().map(|u| u.trim()) {
            if url.is_empty() {
                return Err("--elasticsearch-url: an empty URL in the list".into());
            }
            let (u, a) = parse_url(url)?;
            // Credentials written into a URL become basic auth (the same
            // for every node: they are the cluster's), so the URLs can be logged.
            match (&auth, a) {
                (_, None) => {}
                (None, Some(a)) => auth = Some(a),
                (Some(Auth::Basic { username: u0, password: p0 }), Some(Auth::Basic { username, password }))
                    if *u0 == username && *p0 == password => {}
                _ => {
                    return Err(
                        "--elasticsearch-url: the URLs carry different credentials; give them once with --elasticsearch-username/--elasticsearch-password"
                            .into(),
                    )
                }
            }
            parsed.push(u);
        }
        if parsed.is_empty() {
            return Err("--elasticsearch-url: no URL".into());
        }
        Ok(EsConfig {
            urls: parsed,
            sniff: false,
            auth,
            ca_cert: None,
            names: IndexNames::new(prefix, tenant).map_err(|e| format!("--index-prefix: {e}"))?,
            backoff: Backoff::standard(),
            request_timeout: Duration::from_secs(30),
            retry_on_conflict: 5,
            id_window: Duration::from_secs(7 * 86_400),
            max_ids_per_doc: 10_000,
            bulks_in_flight: usize::from(DEFAULT_BULKS_IN_FLIGHT),
            hourly_retention_days: crate::domain::hours::DEFAULT_HOURLY_RETENTION_DAYS,
        })
    }
}

/// Painless stops a script after this many loop iterations (all loops of
/// one run together).
pub const PAINLESS_MAX_LOOP_COUNTER: u64 = 1_000_000;

impl EsConfig {
    /// The most loop iterations one run of a stored script can take, when a
    /// document gets `events` events with an id and remembers up to
    /// [`EsConfig::max_ids_per_doc`] ids. The scripts loop over the events
    /// (E), then up to three times over the remembered ids (S): to find the
    /// expired ones, after sorting to find the oldest past the cap, and to
    /// remove them (E + 3S). The cap keeps every id of the newest run (they
    /// share one timestamp), so S is at most the cap plus two runs' events.
    pub fn painless_loop_worst_case(&self, events: usize) -> u64 {
        let e = events as u64;
        let s = u64::from(self.max_ids_per_doc) + 2 * e;
        e + 3 * s
    }

    /// Refuses settings with which a script run could reach half of
    /// Painless's loop limit: every item would then fail with a script
    /// error. `max_events_per_request` (`--max-events-per-request`) sizes
    /// the events one document gets in one bulk item, with
    /// [`super::writes::MAX_ID_EVENTS_PER_PLAN`].
    pub fn check_script_loops(&self, max_events_per_request: usize) -> Result<(), String> {
        let events = max_events_per_request.max(super::writes::MAX_ID_EVENTS_PER_PLAN);
        let worst = self.painless_loop_worst_case(events);
        if worst > PAINLESS_MAX_LOOP_COUNTER / 2 {
            return Err(format!(
                "with --max-events-per-request {max_events_per_request} and {} remembered ids per document, \
                 one Elasticsearch script run could loop {worst} times, too near Painless's limit of \
                 {PAINLESS_MAX_LOOP_COUNTER}: lower --max-events-per-request (to at most {})",
                self.max_ids_per_doc,
                self.max_events_within_loop_limit()
            ));
        }
        Ok(())
    }

    /// The largest `--max-events-per-request` [`EsConfig::check_script_loops`] accepts.
    fn max_events_within_loop_limit(&self) -> u64 {
        // E + 3(M + 2E) <= L/2  <=>  E <= (L/2 - 3M) / 7
        (PAINLESS_MAX_LOOP_COUNTER / 2).saturating_sub(3 * u64::from(self.max_ids_per_doc)) / 7
    }

    /// The `timeout` sent with each `_bulk`: how long the engine may wait
    /// for a shard's primary before it fails the items. It defaults to one
    /// minute, longer than [`EsConfig::request_timeout`]: the gateway would
    /// give up (outcome unknown) on a bulk that a slow primary then applies.
    /// Below the client timeout by a fifth of it (1 to 5 s of margin), and at
    /// least 1 s, so the engine answers first.
    pub fn bulk_timeout(&self) -> Duration {
        let margin =
            (self.request_timeout / 5).clamp(Duration::from_secs(1), Duration::from_secs(5));
        self.request_timeout
            .saturating_sub(margin)
            .max(Duration::from_secs(1))
    }

    /// [`EsConfig::bulk_timeout`] as the query parameter's value.
    pub fn bulk_timeout_param(&self) -> String {
        format!("{}ms", self.bulk_timeout().as_millis())
    }
}

impl ElasticsearchArgs {
    /// The store configuration, or `None` when no URL selects Elasticsearch.
    pub fn to_config(&self, id_window: Duration) -> Result<Option<EsConfig>, String> {
        if self.url.is_empty() {
            return Ok(None);
        }
        let urls: Vec<&str> = self.url.iter().map(String::as_str).collect();
        let mut c = EsConfig::with_urls(&urls, &self.index_prefix, DEFAULT_TENANT)?;
        c.sniff = self.sniff;
        c.id_window = id_window;
        c.bulks_in_flight = usize::from(self.bulks_in_flight);
        c.ca_cert = self.ca_cert.as_deref().map(CaCert::read).transpose()?;
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
            url: vec!["http://localhost:9200".into()],
            sniff: false,
            username: Some("elastic".into()),
            password: Some("hunter2".into()),
            api_key: None,
            ca_cert: None,
            index_prefix: "counter-gateway".into(),
            skip_setup: false,
            bulks_in_flight: DEFAULT_BULKS_IN_FLIGHT,
        };
        let c = a.to_config(Duration::from_secs(1)).unwrap().unwrap();
        let shown = format!("{a:?} {c:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("elastic"));
    }

    #[test]
    fn credentials_in_the_url_become_basic_auth() {
        let c = EsConfig::new("https://elastic:hunter2@es.example:9200", "cg", "default").unwrap();
        assert_eq!(c.urls, ["https://es.example:9200/"]);
        assert!(
            matches!(c.auth, Some(Auth::Basic { ref username, ref password }) if username == "elastic" && password == "hunter2")
        );
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    fn with_ca(path: &Path) -> Result<Option<EsConfig>, String> {
        ElasticsearchArgs {
            url: vec!["https://localhost:9200".into()],
            sniff: false,
            username: None,
            password: None,
            api_key: None,
            ca_cert: Some(path.to_path_buf()),
            index_prefix: "counter-gateway".into(),
            skip_setup: false,
            bulks_in_flight: DEFAULT_BULKS_IN_FLIGHT,
        }
        .to_config(Duration::from_secs(1))
    }

    #[test]
    fn a_ca_certificate_is_read_and_checked_at_start() {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/es/test-ca.pem");
        let c = with_ca(&fixture).unwrap().unwrap();
        assert!(c.ca_cert.as_ref().unwrap().validation().is_ok());

        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let e = with_ca(&missing).unwrap_err();
        assert!(
            e.contains("--elasticsearch-ca-cert") && e.contains("cannot read"),
            "{e}"
        );

        let not_pem = dir.path().join("not.pem");
        std::fs::write(&not_pem, "hello").unwrap();
        let e = with_ca(&not_pem).unwrap_err();
        assert!(e.contains("--elasticsearch-ca-cert"), "{e}");

        // PEM markers around something that is not a certificate.
        let bad_body = dir.path().join("bad.pem");
        std::fs::write(
            &bad_body,
            "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let e = with_ca(&bad_body).unwrap_err();
        assert!(e.contains("--elasticsearch-ca-cert"), "{e}");
    }

    #[test]
    fn script_loops_stay_well_under_the_painless_limit() {
        let mut c = EsConfig::new("http://x:9200", "cg", "default").unwrap();
        // The defaults: 10,000 events a request, 10,000 ids a document.
        c.check_script_loops(10_000).unwrap();
        assert!(c.painless_loop_worst_case(10_000) <= PAINLESS_MAX_LOOP_COUNTER / 5);
        let limit = usize::try_from(c.max_events_within_loop_limit()).unwrap();
        c.check_script_loops(limit).unwrap();
        let e = c.check_script_loops(limit + 1).unwrap_err();
        assert!(
            e.contains("--max-events-per-request") && e.contains("1000000"),
            "{e}"
        );
        c.max_ids_per_doc = 200_000;
        assert!(c.check_script_loops(1).is_err());
    }

    #[test]
    fn the_bulk_timeout_is_below_the_client_timeout() {
        let mut c = EsConfig::new("http://x:9200", "cg", "default").unwrap();
        assert_eq!(c.request_timeout, Duration::from_secs(30));
        assert_eq!(c.bulk_timeout_param(), "25000ms");
        for (client, server) in [(5, 4), (2, 1), (1, 1), (60, 55)] {
            c.request_timeout = Duration::from_secs(client);
            assert_eq!(
                c.bulk_timeout(),
                Duration::from_secs(server),
                "client {client} s"
            );
        }
    }

    #[test]
    fn several_urls_repeated_or_comma_separated() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            es: ElasticsearchArgs,
        }
        let urls = |args: &[&str]| {
            let cli =
                Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied())).unwrap();
            cli.es
                .to_config(Duration::from_secs(1))
                .map(|c| c.map(|c| (c.urls, c.sniff)))
        };
        let three = vec![
            "http://a:9200/".to_string(),
            "http://b:9200/".to_string(),
            "http://c:9200/".to_string(),
        ];
        assert_eq!(
            urls(&[
                "--elasticsearch-url",
                "http://a:9200,http://b:9200",
                "--elasticsearch-url",
                "http://c:9200"
            ]),
            Ok(Some((three.clone(), false)))
        );
        assert_eq!(
            urls(&[
                "--elasticsearch-url",
                "http://a:9200, http://b:9200 ,http://c:9200",
                "--elasticsearch-sniff"
            ]),
            Ok(Some((three, true)))
        );
        assert_eq!(urls(&[]), Ok(None));
        let e = urls(&["--elasticsearch-url", "http://a:9200,,http://b:9200"]).unwrap_err();
        assert!(e.contains("empty URL"), "{e}");
        let e = urls(&["--elasticsearch-url", "http://a:9200,b:9200"]).unwrap_err();
        assert!(e.contains("--elasticsearch-url"), "{e}");
        let c = EsConfig::new("http://u:p@a:1,http://b:2", "cg", "default").unwrap();
        assert!(matches!(c.auth, Some(Auth::Basic { ref username, .. }) if username == "u"));
        assert_eq!(c.urls, ["http://a:1/", "http://b:2/"]);
        let e = EsConfig::new("http://u:p@a:1,http://v:q@b:2", "cg", "default").unwrap_err();
        assert!(e.contains("different credentials"), "{e}");
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
