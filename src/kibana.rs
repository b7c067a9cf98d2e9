//! Kibana objects for the Elasticsearch store: the saved objects of
//! `index-templates/kibana/` (data views and a dashboard), with the index
//! prefix put in, imported by `setup --kibana-url` through Kibana's saved
//! objects API. Importing twice replaces the objects (`overwrite=true`), so
//! it is safe to run at every deployment.

use crate::store::elasticsearch::config::Auth;
use crate::store::elasticsearch::request::validate_index_part;

/// The saved objects, written for the default prefix.
pub const SAVED_OBJECTS: &str = include_str!("../index-templates/kibana/counter-gateway.ndjson");
/// The prefix [`SAVED_OBJECTS`] is written for; every occurrence (index
/// patterns, object ids, titles) names the prefix.
pub const FILE_PREFIX: &str = "counter-gateway";
/// The name the file is uploaded under.
pub const FILE_NAME: &str = "counter-gateway.ndjson";
/// Kibana's import endpoint, replacing objects with the same ids.
pub const IMPORT_PATH: &str = "/api/saved_objects/_import?overwrite=true";
/// The multipart boundary: fixed, so the request is reproducible; it cannot
/// occur in NDJSON, whose lines are JSON objects.
pub const BOUNDARY: &str = "----counter-gateway-kibana-import";

/// The saved objects for indices named `<prefix>_<tenant>_<collection>`.
pub fn saved_objects(prefix: &str) -> Result<String, String> {
    validate_index_part("index prefix", prefix)?;
    Ok(SAVED_OBJECTS.replace(FILE_PREFIX, prefix))
}

/// A `multipart/form-data` body with `ndjson` as its one file field, `file`,
/// as Kibana's import API takes it. Built by hand: one part, and no new
/// dependency (reqwest's `multipart` feature would add crates).
pub fn multipart_body(ndjson: &str) -> Vec<u8> {
    format!(
        "--{BOUNDARY}\r\n\
         Content-Disposition: form-data; name=\"file\"; filename=\"{FILE_NAME}\"\r\n\
         Content-Type: application/ndjson\r\n\r\n\
         {ndjson}\r\n\
         --{BOUNDARY}--\r\n"
    )
    .into_bytes()
}

/// What Kibana said about an import.
#[derive(Debug)]
pub struct ImportReport {
    pub objects: u64,
}

/// Imports the saved objects for `prefix` into the Kibana at `url`,
/// authenticated as `auth` (Kibana checks the Elasticsearch user or API key).
pub async fn import(url: &str, auth: Option<&Auth>, prefix: &str) -> Result<ImportReport, String> {
    let body = multipart_body(&saved_objects(prefix)?);
    let base = url.trim_end_matches('/');
    if !(base.starts_with("http://") || base.starts_with("https://")) {
        return Err(format!(
            "--kibana-url must start with http:// or https://, got {url:?}"
        ));
    }
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(60))
        .build()
        .map_err(|e| format!("kibana client: {e}"))?;
    let mut req = client
        .post(format!("{base}{IMPORT_PATH}"))
        .header("kbn-xsrf", "true")
        .header(
            reqwest::header::CONTENT_TYPE,
            format!("multipart/form-data; boundary={BOUNDARY}"),
        )
        .body(body);
    req = match auth {
        Some(Auth::Basic { username, password }) => req.basic_auth(username, Some(password)),
        Some(Auth::ApiKey(key)) => {
            req.header(reqwest::header::AUTHORIZATION, format!("ApiKey {key}"))
        }
        None => req,
    };
    let res = req
        .send()
        .await
        .map_err(|e| format!("importing into Kibana at {base}: {e}"))?;
    let status = res.status().as_u16();
    let text = res.text().await.unwrap_or_default();
    let shown: String = text.chars().take(500).collect();
    if status == 401 || status == 403 {
        return Err(format!(
            "Kibana answered {status}: the user needs to manage saved objects (Kibana privilege \
             `Saved Objects Management`, or `all` on the space): {shown}"
        ));
    }
    if !(200..300).contains(&status) {
        return Err(format!("Kibana answered {status} to the import: {shown}"));
    }
    let answer: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("Kibana's import answer is not JSON ({e}): {shown}"))?;
    if answer["success"] != serde_json::Value::Bool(true) {
        let errors: Vec<String> = answer["errors"]
            .as_array()
            .map(|errs| {
                errs.iter()
                    .map(|e| {
                        format!(
                            "{} {}: {}",
                            e["type"].as_str().unwrap_or("?"),
                            e["id"].as_str().unwrap_or("?"),
                            e["error"]["type"].as_str().unwrap_or("error")
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        return Err(format!(
            "Kibana refused part of the import: {}",
            if errors.is_empty() {
                shown
            } else {
                errors.join("; ")
            }
        ));
    }
    Ok(ImportReport {
        objects: answer["successCount"].as_u64().unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefix_is_put_everywhere_and_checked() {
        let s = saved_objects("acme").unwrap();
        assert!(!s.contains(FILE_PREFIX));
        assert!(s.contains("\"title\":\"acme_*_counters,-acme_*_average_counters\""));
        assert!(saved_objects("Bad_Prefix").is_err());
        assert_eq!(saved_objects(FILE_PREFIX).unwrap(), SAVED_OBJECTS);
    }

    #[test]
    fn the_body_has_one_file_part() {
        let body = String::from_utf8(multipart_body("{\"a\":1}\n")).unwrap();
        assert!(body.starts_with(&format!("--{BOUNDARY}\r\n")));
        assert!(body.contains("name=\"file\"; filename=\"counter-gateway.ndjson\""));
        assert!(body.ends_with(&format!("{{\"a\":1}}\n\r\n--{BOUNDARY}--\r\n")));
        assert!(!SAVED_OBJECTS.contains(BOUNDARY));
    }
}
