//! Known crawlers, left out of browser ingestion. A crawler that runs a
//! page's scripts (its beacons) or loads its images (the pixel) would
//! otherwise count as a reader; a server that counts for itself must never
//! lose a count to the name its HTTP library goes by.
//!
//! **Browser ingestion** is a counting write that carries a browser's mark:
//! - the pixel (`GET /v1/pixel/...`), which only an image tag fetches;
//! - an increment, decrement or `POST /v1/events` with a `text/plain` body
//!   (what `navigator.sendBeacon` sends, and a page's `fetch` that avoids a
//!   CORS preflight);
//! - one with an `Origin` header (browsers send it on every cross-origin
//!   request and on every `POST`; HTTP libraries do not);
//! - one with a `write` key and a `User-Agent` that starts with `Mozilla/`,
//!   as every browser's does (and every crawler's that renders pages).
//!
//! Any other write is server-to-server and always counted, whatever its
//! `User-Agent` says. Browser ingestion whose `User-Agent` is a known
//! crawler's is answered `202 Accepted` with `X-Counter-Ignored: crawler`
//! and counts nothing, unless `--count-crawlers` is set.
//!
//! The list of crawlers is the npm package isbot's (`crawlers/`, with its
//! version and licence; `scripts/refresh-isbot.sh` refreshes it), matched
//! as isbot matches it: any pattern, case-insensitively. Most patterns are
//! plain regular expressions, checked together in one pass of a `RegexSet`.
//! A few use look-around, which the `regex` crate has not: each is first
//! checked without its look-arounds (a pattern that matches wherever the
//! whole does, and more) in a second set, and only where that matches is
//! the whole pattern run on a backtracking engine (`fancy-regex`), anchored
//! at each place where the part without look-around starts a match. A
//! browser's `User-Agent` thus costs two passes of a set, not a backtracking
//! run of each look-around pattern over every byte of it.

use std::sync::Arc;
use std::sync::OnceLock;

use axum::extract::FromRequestParts;
use axum::http::{header, request::Parts, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use regex::bytes::{RegexSet, RegexSetBuilder};
use serde::Deserialize;

use super::edge::IGNORED_HEADER;
use super::model::EventsAccepted;
use super::Gateway;
use crate::auth::Role;
use crate::metrics::Metrics;

/// isbot's patterns as `scripts/refresh-isbot.sh` vendors them.
const ISBOT: &str = include_str!("crawlers/isbot-patterns.json");

/// What [`IGNORED_HEADER`] says of a known crawler.
pub const CRAWLER: &str = "crawler";

/// Fetchers isbot lists that fetch for a person: mail services that load a
/// message's images when it is opened, through a proxy of theirs (Gmail,
/// Yahoo Mail), and GitHub's image proxy, camo, which fetches a README's
/// images for the person viewing it (again on each view of a `no-cache`
/// image, such as a badge). Counted, or no open read in such a mail, and
/// no view of a README's badge, would ever count. Matched
/// case-insensitively anywhere in the `User-Agent`.
const READERS: [&str; 3] = ["googleimageproxy", "yahoomailproxy", "github-camo"];

#[derive(Deserialize)]
struct Vendored {
    package: String,
    version: String,
    patterns: Vec<String>,
}

/// A compiled crawler list.
pub struct CrawlerList {
    /// `isbot 5.2.3`: what the list is, for logs.
    name: String,
    /// The patterns without look-around, as they are.
    plain: RegexSet,
    /// The patterns with look-around, without it: a match here is a
    /// candidate for the pattern of the same index in `exact`.
    candidates: RegexSet,
    exact: Vec<Exact>,
}

/// A pattern with look-around: where a match of it may start (its
/// look-around-free part, on the fast engine), and the whole pattern,
/// run only anchored at those starts.
struct Exact {
    starts: regex::bytes::Regex,
    whole: fancy_regex::Regex,
}

impl Exact {
    /// Whether the whole pattern matches somewhere in `ua`. A match of it
    /// starting at `s` is a match of its look-around-free part starting
    /// at `s`, so the starts of those, each found by one search from the
    /// previous start on, are every place where it can start. The
    /// backtracking engine then tries each of these places alone: run
    /// unanchored it tries every byte of the agent (some 10 µs on a
    /// browser's 120 bytes, measured), anchored well under one.
    fn is_match(&self, ua: &[u8]) -> bool {
        let mut from = 0;
        while let Some(m) = self.starts.find_at(ua, from) {
            let at = fancy_regex::RegexInput::new(ua)
                .from_pos(m.start())
                .anchored(true);
            // A pattern the engine gives up on (past its step limit) does
            // not make a crawler: when in doubt, count.
            if self.whole.is_match_input(at).unwrap_or(false) {
                return true;
            }
            if m.start() >= ua.len() {
                return false;
            }
            from = m.start() + 1;
        }
        false
    }
}

impl std::fmt::Debug for CrawlerList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CrawlerList({})", self.name)
    }
}

impl CrawlerList {
    /// Compiles a list in the format of `crawlers/isbot-patterns.json`; the
    /// error names a pattern that does not compile.
    pub fn from_json(json: &str) -> Result<CrawlerList, String> {
        let v: Vendored =
            serde_json::from_str(json).map_err(|e| format!("the crawler list: {e}"))?;
        let mut plain = Vec::new();
        let mut candidates = Vec::new();
        let mut exact = Vec::new();
        for js in &v.patterns {
            let p = from_js(js);
            match without_lookaround(&p) {
                None => plain.push(p),
                Some(stripped) => {
                    let whole = fancy_regex::RegexBuilder::new(&p)
                        .case_insensitive(true)
                        .build()
                        .map_err(|e| format!("crawler pattern {js:?}: {e}"))?;
                    let starts = builder(&stripped)
                        .build()
                        .map_err(|e| format!("crawler pattern {js:?}: {e}"))?;
                    candidates.push(stripped);
                    exact.push(Exact { starts, whole });
                }
            }
        }
        Ok(CrawlerList {
            name: format!("{} {}", v.package, v.version),
            plain: set(&plain)?,
            candidates: set(&candidates)?,
            exact,
        })
    }

    /// `isbot 5.2.3`: the package and version the list comes from.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many patterns the list holds.
    pub fn len(&self) -> usize {
        self.plain.len() + self.exact.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `user_agent` is a known crawler's. An empty one is not (as
    /// in isbot), nor are the [`READERS`].
    pub fn is_crawler(&self, user_agent: &[u8]) -> bool {
        if user_agent.is_empty() || !self.listed(user_agent) {
            return false;
        }
        !READERS.iter().any(|r| contains_ignore_case(user_agent, r))
    }

    fn listed(&self, ua: &[u8]) -> bool {
        if self.plain.is_match(ua) {
            return true;
        }
        self.candidates
            .matches(ua)
            .iter()
            .any(|i| self.exact[i].is_match(ua))
    }
}

/// One isbot pattern, matched as isbot's JavaScript pattern is: on bytes,
/// case-insensitively, with `\w`, `\d` and `\b` meaning ASCII (a
/// `User-Agent` is ASCII in practice; HTTP allows no more than Latin-1).
fn builder(pattern: &str) -> regex::bytes::RegexBuilder {
    let mut b = regex::bytes::RegexBuilder::new(pattern);
    b.case_insensitive(true).unicode(false);
    b
}

/// A set of isbot patterns, each as [`builder`] compiles one.
fn set(patterns: &[impl AsRef<str>]) -> Result<RegexSet, String> {
    RegexSetBuilder::new(patterns)
        .case_insensitive(true)
        .unicode(false)
        .build()
        .map_err(|e| {
            // Name the pattern at fault, not the whole set.
            let bad = patterns
                .iter()
                .map(AsRef::as_ref)
                .find(|p| builder(p).build().is_err());
            format!("crawler pattern {bad:?}: {e}")
        })
}

/// A JavaScript pattern in the `regex` crate's syntax. The one difference
/// isbot's patterns meet: in a class, JavaScript reads a `-` next to a
/// class escape (`[\w\d-.]`) as itself, where `regex` refuses the range.
fn from_js(pattern: &str) -> String {
    const CLASS_ESCAPES: [&str; 6] = ["\\w", "\\d", "\\s", "\\W", "\\D", "\\S"];
    let mut out = String::with_capacity(pattern.len());
    let mut in_class = false;
    let mut after_class_escape = false;
    let mut rest = pattern;
    while let Some(c) = rest.chars().next() {
        let len = match c {
            '\\' => 1 + rest[1..].chars().next().map_or(0, char::len_utf8),
            _ => c.len_utf8(),
        };
        let token = &rest[..len];
        rest = &rest[len..];
        let is_class_escape = in_class && CLASS_ESCAPES.contains(&token);
        if in_class
            && token == "-"
            && (after_class_escape || CLASS_ESCAPES.iter().any(|e| rest.starts_with(e)))
        {
            out.push_str("\\-");
        } else {
            out.push_str(token);
        }
        match token {
            "[" => in_class = true,
            "]" => in_class = false,
            _ => {}
        }
        after_class_escape = is_class_escape;
    }
    out
}

fn contains_ignore_case(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

/// `pattern` with its look-around groups (`(?=..)`, `(?!..)`, `(?<=..)`,
/// `(?<!..)`) removed, or `None` when it has none. Removing an assertion
/// only relaxes a pattern, so the result matches wherever `pattern` does.
fn without_lookaround(pattern: &str) -> Option<String> {
    let mut out = String::with_capacity(pattern.len());
    let mut found = false;
    let mut in_class = false;
    let mut rest = pattern;
    while let Some(c) = rest.chars().next() {
        if c == '(' && !in_class && is_lookaround(rest) {
            let len = group_len(rest)?;
            rest = &rest[len..];
            found = true;
            continue;
        }
        let len = match c {
            // An escape and the character it escapes, whatever it is.
            '\\' => 1 + rest[1..].chars().next().map_or(0, char::len_utf8),
            _ => c.len_utf8(),
        };
        match c {
            '[' => in_class = true,
            ']' => in_class = false,
            _ => {}
        }
        out.push_str(&rest[..len]);
        rest = &rest[len..];
    }
    found.then_some(out)
}

fn is_lookaround(at: &str) -> bool {
    ["(?=", "(?!", "(?<=", "(?<!"]
        .iter()
        .any(|p| at.starts_with(p))
}

/// The length in bytes of the group `at` opens, up to its closing `)`;
/// `None` when it is never closed.
fn group_len(at: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_class = false;
    let mut chars = at.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            '[' if !in_class => in_class = true,
            ']' if in_class => in_class = false,
            '(' if !in_class => depth += 1,
            ')' if !in_class => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// The vendored list, compiled once for the process; the error names the
/// pattern that does not compile (a unit test makes sure none is left).
pub fn list() -> Result<&'static CrawlerList, &'static str> {
    static LIST: OnceLock<Result<CrawlerList, String>> = OnceLock::new();
    LIST.get_or_init(|| CrawlerList::from_json(ISBOT))
        .as_ref()
        .map_err(String::as_str)
}

/// Whether `user_agent` is a known crawler's by the vendored list.
pub fn is_known_crawler(user_agent: &[u8]) -> bool {
    list().is_ok_and(|l| l.is_crawler(user_agent))
}

/// Who sent a counting write, as far as counting goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sender {
    /// Browser ingestion from a known crawler: answered, not counted.
    Crawler,
    /// Anyone else: counted.
    Counted,
}

impl Sender {
    fn crawler_if(crawler: bool) -> Sender {
        if crawler {
            Sender::Crawler
        } else {
            Sender::Counted
        }
    }
}

/// Whether a counting write is browser ingestion from a known crawler,
/// to be answered without counting (see the module's documentation).
pub struct Crawler(pub Sender);

impl FromRequestParts<Arc<Gateway>> for Crawler {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        gw: &Arc<Gateway>,
    ) -> Result<Self, Self::Rejection> {
        Ok(Crawler(sender(parts, gw)))
    }
}

/// What [`Crawler`] tells of a request (for the increment's fast path too).
pub(super) fn sender(parts: &Parts, gw: &Gateway) -> Sender {
    Sender::crawler_if(left_out(parts, gw))
}

/// [`Crawler`] for the pixel, which is browser ingestion whatever it carries.
pub struct PixelCrawler(pub Sender);

impl FromRequestParts<Arc<Gateway>> for PixelCrawler {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        gw: &Arc<Gateway>,
    ) -> Result<Self, Self::Rejection> {
        let crawler = !gw.count_crawlers
            && user_agent(&parts.headers).is_some_and(|ua| is_known_crawler(ua.as_bytes()));
        Ok(PixelCrawler(Sender::crawler_if(crawler)))
    }
}

/// The checks in the order of their cost: a server-to-server write (the
/// bulk of the traffic of a busy gateway) is told by a header or two,
/// without a look at the list; the key is looked up again only for a
/// crawler with nothing but its `User-Agent` to say it is a browser.
fn left_out(parts: &Parts, gw: &Gateway) -> bool {
    if gw.count_crawlers {
        return false;
    }
    let Some(ua) = user_agent(&parts.headers) else {
        return false;
    };
    let marked = is_text_plain(&parts.headers) || parts.headers.contains_key(header::ORIGIN);
    if !marked && !looks_like_a_browser(ua) {
        return false;
    }
    if !is_known_crawler(ua.as_bytes()) {
        return false;
    }
    marked || super::access::presented_role(parts, gw) == Some(Role::Write)
}

fn user_agent(headers: &HeaderMap) -> Option<&HeaderValue> {
    headers.get(header::USER_AGENT).filter(|v| !v.is_empty())
}

/// `text/plain`, whatever its parameters (`;charset=UTF-8`).
fn is_text_plain(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).is_some_and(|ct| {
        let mime = ct
            .as_bytes()
            .split(|b| *b == b';')
            .next()
            .unwrap_or_default();
        mime.trim_ascii().eq_ignore_ascii_case(b"text/plain")
    })
}

/// Every browser's `User-Agent` starts with `Mozilla/` (for thirty years,
/// so that sites serve them the full page).
fn looks_like_a_browser(ua: &HeaderValue) -> bool {
    ua.as_bytes()
        .get(..8)
        .is_some_and(|p| p.eq_ignore_ascii_case(b"mozilla/"))
}

/// Counts `events` left out as a crawler's in `/metrics`.
pub fn record(metrics: &Metrics, events: usize) {
    metrics.record_crawler_events_ignored(events);
}

/// The answer to a counting write left out as a crawler's: `202 Accepted`
/// (200 means applied), `X-Counter-Ignored: crawler`, and how many events
/// were ignored.
pub fn ignored(metrics: &Metrics, events: usize) -> Response {
    record(metrics, events);
    (
        StatusCode::ACCEPTED,
        [(IGNORED_HEADER, CRAWLER)],
        Json(EventsAccepted {
            accepted: 0,
            duplicates: 0,
            repeats: 0,
            ignored: events,
        }),
    )
        .into_response()
}

/// The `202` of a counting write, for `#[utoipa::path]`.
pub struct Ignored;

impl utoipa::IntoResponses for Ignored {
    fn responses(
    ) -> std::collections::BTreeMap<String, utoipa::openapi::RefOr<utoipa::openapi::Response>> {
        use utoipa::PartialSchema;
        let response = utoipa::openapi::ResponseBuilder::new()
            .description(IGNORED_DESCRIPTION)
            .header(IGNORED_HEADER_NAME, ignored_header())
            .content(
                "application/json",
                utoipa::openapi::ContentBuilder::new()
                    .schema(Some(EventsAccepted::schema()))
                    .build(),
            )
            .build();
        [("202".to_string(), response.into())].into()
    }
}

/// How the description names [`IGNORED_HEADER`].
pub const IGNORED_HEADER_NAME: &str = "X-Counter-Ignored";

/// Why an answer is a `202`.
pub const IGNORED_DESCRIPTION: &str = "Browser ingestion from a known crawler (isbot's list): nothing counted; `X-Counter-Ignored: crawler`";

/// [`IGNORED_HEADER`] in a description.
pub fn ignored_header() -> utoipa::openapi::Header {
    utoipa::openapi::HeaderBuilder::new()
        .schema(
            utoipa::openapi::ObjectBuilder::new()
                .schema_type(utoipa::openapi::Type::String)
                .enum_values(Some([CRAWLER])),
        )
        .description(Some("Why nothing was counted"))
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_vendored_pattern_compiles() {
        let list = list().unwrap();
        let vendored: Vendored = serde_json::from_str(ISBOT).unwrap();
        assert_eq!(list.len(), vendored.patterns.len());
        assert!(list.len() > 100, "{}", list.len());
        assert!(list.name().starts_with("isbot 5."), "{}", list.name());
        // The look-around patterns are the few, each with a candidate.
        assert_eq!(list.candidates.len(), list.exact.len());
        assert!((1..20).contains(&list.exact.len()), "{}", list.exact.len());
    }

    #[test]
    fn a_dash_beside_a_class_escape_is_itself() {
        assert_eq!(from_js(r"[\w\d-.]+"), r"[\w\d\-.]+");
        assert_eq!(from_js(r"[.-\d]"), r"[.\-\d]");
        assert_eq!(from_js(r"[a-z\d]-\w"), r"[a-z\d]-\w");
        assert_eq!(from_js(r"[\w\-]"), r"[\w\-]");
        let list = CrawlerList::from_json(
            r#"{"package": "t", "version": "1", "patterns": ["^x[\\w\\d-.]+$"]}"#,
        )
        .unwrap();
        assert!(list.is_crawler(b"xa-b.c"));
        assert!(!list.is_crawler(b"xa/b"));
    }

    #[test]
    fn look_arounds_are_removed_and_nothing_else() {
        assert_eq!(without_lookaround("crawl"), None);
        assert_eq!(without_lookaround("[(?!]x"), None);
        assert_eq!(without_lookaround(r"\(?!x"), None);
        assert_eq!(without_lookaround("(?<!cam)scan").as_deref(), Some("scan"));
        assert_eq!(
            without_lookaround(r"(?<! channel/|google/)google(?!(?:wv|app|/google| pixel))")
                .as_deref(),
            Some("google")
        );
        assert_eq!(
            without_lookaround(r"(?<! cu)bots?(?:\b|_)").as_deref(),
            Some(r"bots?(?:\b|_)")
        );
        assert_eq!(without_lookaround(r"a(?=[)]\))b").as_deref(), Some("ab"));
        // Never closed: left to the engine, which refuses it.
        assert_eq!(without_lookaround("a(?!b"), None);
    }

    #[test]
    fn crawlers_browsers_and_readers() {
        let list = list().unwrap();
        let chrome = b"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36";
        assert!(!list.is_crawler(chrome));
        assert!(list.is_crawler(
            b"Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
        ));
        assert!(list.is_crawler(b"curl/8.5.0"));
        // Case-insensitive, as isbot.
        assert!(list.is_crawler(b"MOZILLA/5.0 (COMPATIBLE; BINGBOT/2.0)"));
        assert!(!list.is_crawler(b""));
        // isbot lists them; they fetch for a person who opened a mail.
        assert!(list.listed(b"Mozilla/5.0 (Windows NT 5.1; rv:11.0) Gecko Firefox/11.0 (via ggpht.com GoogleImageProxy)"));
        assert!(!list.is_crawler(b"Mozilla/5.0 (Windows NT 5.1; rv:11.0) Gecko Firefox/11.0 (via ggpht.com GoogleImageProxy)"));
        assert!(!list.is_crawler(
            b"YahooMailProxy; https://help.yahoo.com/kb/yahoo-mail-proxy-SLN28749.html"
        ));
        // Not UTF-8: matched as bytes, never a panic.
        assert!(list.is_crawler(b"\xff\xfe spider"));
        assert!(!list.is_crawler(b"Mozilla/5.0 (X11; Linux x86_64) \xe9"));
    }

    /// The whole pattern is tried at every place its look-around-free part
    /// starts a match, not only the first.
    #[test]
    fn a_look_around_pattern_is_tried_at_every_candidate_start() {
        let list = CrawlerList::from_json(
            r#"{"package": "t", "version": "1", "patterns": ["(?<!cam)scan", "(?:^|[^g])news(?!sapphire)"]}"#,
        )
        .unwrap();
        assert!(!list.is_crawler(b"CamScanner/6.5"));
        assert!(!list.is_crawler(b"camscan camscan"));
        assert!(list.is_crawler(b"camscan scan"));
        assert!(list.is_crawler(b"Scanner"));
        assert!(!list.is_crawler(b"x NewsSapphire gnews"));
        assert!(list.is_crawler(b"x NewsSapphire news"));
        assert!(list.is_crawler(b"newsbot"));
        assert!(!list.is_crawler(b"scam"));
    }

    #[test]
    fn a_list_that_does_not_compile_names_the_pattern() {
        let e = CrawlerList::from_json(
            r#"{"package": "t", "version": "1", "patterns": ["ok", "a(b"]}"#,
        )
        .unwrap_err();
        assert!(e.contains("\"a(b\""), "{e}");
        let e = CrawlerList::from_json(
            r#"{"package": "t", "version": "1", "patterns": ["(?<!x)a(b"]}"#,
        )
        .unwrap_err();
        assert!(e.contains("(?<!x)a(b"), "{e}");
    }
}
