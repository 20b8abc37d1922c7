//! Reads counters and gauges from the nodes' Prometheus endpoints (`GET /metrics` on each
//! node's HTTP address), for scenarios that measure what the service does on its own (the
//! session-expiry run counts the bound leases the nodes reclaimed; the scale run reads each
//! node's memory, state and snapshot figures).
//!
//! Must not depend on: any server crate; it parses the text exposition like any scraper would.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// A scrape larger than this is refused (a node's exposition is a few tens of KiB).
const EXPOSITION_BYTES_MAX: usize = 4 << 20;
/// Bound of one scrape of one node.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a scrape failed.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// A URL that does not parse.
    #[error("{url}: not a URL: {reason}")]
    BadUrl {
        /// The URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The node did not answer in time, refused, or answered something other than 200.
    #[error("{url}: {reason}")]
    Unreachable {
        /// The endpoint scraped.
        url: String,
        /// What went wrong.
        reason: String,
    },
}

/// The nodes' metrics endpoints.
#[derive(Debug, Clone)]
pub struct NodeMetrics {
    client: HyperClient<HttpConnector, Empty<Bytes>>,
    bases: Vec<String>,
    urls: Vec<String>,
}

impl NodeMetrics {
    /// `base_urls` are the nodes' HTTP addresses (`http://host:port`), as in `cluster.json`.
    pub fn new(base_urls: &[String]) -> Self {
        NodeMetrics {
            client: HyperClient::builder(TokioExecutor::new()).build(HttpConnector::new()),
            bases: base_urls
                .iter()
                .map(|url| url.trim_end_matches('/').to_owned())
                .collect(),
            urls: base_urls
                .iter()
                .map(|url| format!("{}/metrics", url.trim_end_matches('/')))
                .collect(),
        }
    }

    /// The sum over every node of the samples of counter `name` (all label sets). Every node
    /// must answer: a partial sum would look like progress going backwards.
    pub async fn counter_sum(&self, name: &str) -> Result<f64, ScrapeError> {
        // Every node at once, so the sum is as close to one moment as the slowest answer.
        let mut scrapes = tokio::task::JoinSet::new();
        for url in &self.urls {
            let (client, url) = (self.client.clone(), url.clone());
            scrapes.spawn(async move { scrape(&client, &url).await });
        }
        let mut total = 0.0;
        while let Some(joined) = scrapes.join_next().await {
            let text = joined.map_err(|error| ScrapeError::Unreachable {
                url: "(scrape task)".into(),
                reason: error.to_string(),
            })??;
            total += sample_sum(&text, name);
        }
        Ok(total)
    }
}

impl NodeMetrics {
    /// The sum over every node of gauge `name` (as [`NodeMetrics::counter_sum`] sums a
    /// counter).
    pub async fn gauge_sum(&self, name: &str) -> Result<f64, ScrapeError> {
        self.counter_sum(name).await
    }

    /// Every node's exposition, scraped at once, in the order of the URLs given to
    /// [`NodeMetrics::new`]; a node that does not answer gives its error in its place.
    pub async fn per_node(&self) -> Vec<Result<Exposition, ScrapeError>> {
        let mut scrapes = tokio::task::JoinSet::new();
        for (index, url) in self.urls.iter().enumerate() {
            let (client, url) = (self.client.clone(), url.clone());
            scrapes.spawn(async move { (index, scrape(&client, &url).await) });
        }
        let mut answers: Vec<Option<Result<Exposition, ScrapeError>>> =
            self.urls.iter().map(|_| None).collect();
        while let Some(joined) = scrapes.join_next().await {
            if let Ok((index, answer)) = joined
                && let Some(slot) = answers.get_mut(index)
            {
                *slot = Some(answer.map(|text| Exposition { text }));
            }
        }
        answers
            .into_iter()
            .zip(&self.urls)
            .map(|(answer, url)| {
                answer.unwrap_or_else(|| {
                    Err(ScrapeError::Unreachable {
                        url: url.clone(),
                        reason: "the scrape task failed".into(),
                    })
                })
            })
            .collect()
    }

    /// Whether each node answers `GET /readyz` with 200 now (in the order of the URLs given to
    /// [`NodeMetrics::new`]; a node that does not answer is not ready).
    pub async fn ready_per_node(&self) -> Vec<bool> {
        let mut probes = tokio::task::JoinSet::new();
        for (index, base) in self.bases.iter().enumerate() {
            let (client, url) = (self.client.clone(), format!("{base}/readyz"));
            probes.spawn(async move { (index, scrape(&client, &url).await.is_ok()) });
        }
        let mut ready = vec![false; self.bases.len()];
        while let Some(joined) = probes.join_next().await {
            if let Ok((index, answered)) = joined
                && let Some(slot) = ready.get_mut(index)
            {
                *slot = answered;
            }
        }
        ready
    }

    /// The largest value of metric `name` over the nodes that export it (`None` when no node
    /// answered with it).
    pub async fn max_over_nodes(&self, name: &str) -> Option<f64> {
        self.per_node()
            .await
            .iter()
            .filter_map(|answer| answer.as_ref().ok()?.value(name))
            .reduce(f64::max)
    }
}

/// One node's text exposition.
#[derive(Debug, Clone)]
pub struct Exposition {
    text: String,
}

impl Exposition {
    /// Wraps a text exposition.
    pub fn new(text: String) -> Self {
        Exposition { text }
    }

    /// The sum of the samples of metric `name` (all label sets), or `None` when the node does
    /// not export it (a metric its version does not have: "not available", not zero).
    pub fn value(&self, name: &str) -> Option<f64> {
        sample_value(&self.text, name)
    }
}

/// One node's exposition, within `SCRAPE_TIMEOUT` for the whole exchange.
async fn scrape(
    client: &HyperClient<HttpConnector, Empty<Bytes>>,
    url: &str,
) -> Result<String, ScrapeError> {
    let unreachable = |reason: String| ScrapeError::Unreachable {
        url: url.to_owned(),
        reason,
    };
    tokio::time::timeout(SCRAPE_TIMEOUT, scrape_unbounded(client, url))
        .await
        .map_err(|_| unreachable("timed out".into()))?
}

async fn scrape_unbounded(
    client: &HyperClient<HttpConnector, Empty<Bytes>>,
    url: &str,
) -> Result<String, ScrapeError> {
    let uri: hyper::Uri =
        url.parse()
            .map_err(|error: hyper::http::uri::InvalidUri| ScrapeError::BadUrl {
                url: url.to_owned(),
                reason: error.to_string(),
            })?;
    let unreachable = |reason: String| ScrapeError::Unreachable {
        url: url.to_owned(),
        reason,
    };
    let response = client
        .get(uri)
        .await
        .map_err(|error| unreachable(error.to_string()))?;
    if !response.status().is_success() {
        return Err(unreachable(format!("status {}", response.status())));
    }
    let body = http_body_util::Limited::new(response.into_body(), EXPOSITION_BYTES_MAX);
    let bytes = body
        .collect()
        .await
        .map_err(|error| unreachable(format!("body: {error}")))?
        .to_bytes();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The sum of every sample of metric `name` in a Prometheus text exposition (comments and
/// other metrics skipped; a value that does not parse counts as nothing).
pub fn sample_sum(exposition: &str, name: &str) -> f64 {
    sample_value(exposition, name).unwrap_or(0.0)
}

/// The sum of every sample of metric `name` in a Prometheus text exposition, or `None` when it
/// has no sample of that name with a value that parses.
pub fn sample_value(exposition: &str, name: &str) -> Option<f64> {
    exposition
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            // The name must end here: `name 3` or `name{labels} 3`, not `name_other 3`.
            let value = match rest.chars().next()? {
                ' ' => rest,
                '{' => &rest[labels_end(rest)?..],
                _ => return None,
            };
            value.split_whitespace().next()?.parse::<f64>().ok()
        })
        .reduce(|sum, value| sum + value)
}

/// The index just past the `}` closing the label set that `text` starts with (a `}` inside a
/// quoted label value, escapes included, does not close it).
fn labels_end(text: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (index, c) in text.char_indices() {
        match (quoted, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (_, false, '"') => quoted = !quoted,
            (false, _, '}') => return Some(index + 1),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::{Exposition, sample_sum, sample_value};

    #[test]
    fn sums_one_metric_over_label_sets_only() {
        let text = "# HELP tenure_x_total x\n# TYPE tenure_x_total counter\n\
                    tenure_x_total 3\n\
                    tenure_x_total{op=\"a\"} 4.5\n\
                    tenure_x_total_other 100\n\
                    tenure_x_totals 7\n\
                    tenure_y 9\n\
                    tenure_x_total{op=\"b\"} not-a-number\n\
                    tenure_x_total{path=\"/a}b\",q=\"x\\\"}\"} 2\n";
        assert!((sample_sum(text, "tenure_x_total") - 9.5).abs() < 1e-9);
        assert!((sample_sum(text, "tenure_absent") - 0.0).abs() < 1e-9);
        // Absent is not zero.
        assert_eq!(sample_value(text, "tenure_absent"), None);
        assert_eq!(sample_value(text, "tenure_y"), Some(9.0));
        let node = Exposition::new("tenure_g 0\n".into());
        assert_eq!(node.value("tenure_g"), Some(0.0));
        assert_eq!(node.value("tenure_h"), None);
    }
}
