//! Path matching compiled from the route table: exact paths by hash lookup, `{param}`
//! patterns segment by segment.

use std::collections::HashMap;

use super::endpoint::Endpoint;
use super::request::percent_decode;
use crate::api::{Listener, Method};

/// The dispatch index over a table of endpoints. Built once per catalog at start, with
/// one allocation per path: the table's paths are not copied segment by segment, and
/// duplicate patterns are found through a hash of their shapes rather than a set of
/// shape strings (the three routers allocated about 1,100 times per start before).
pub struct Router {
    /// Keyed by path alone so a lookup borrows the request's path without allocating;
    /// the value is the endpoint per method ([`method_slot`]).
    exact: HashMap<String, [Option<u32>; 3]>,
    /// `{param}` patterns, normalised, in matching order.
    patterns: Vec<(Method, String, usize)>,
}

/// A successful lookup: the endpoint's index and its decoded path parameters.
pub struct RouteMatch {
    pub index: usize,
    pub params: Vec<(String, String)>,
}

fn method_slot(method: Method) -> usize {
    match method {
        Method::Get => 0,
        Method::Post => 1,
        Method::Delete => 2,
    }
}

/// A normalised path's segments after the leading `/`.
fn segments(path: &str) -> std::str::Split<'_, char> {
    let mut parts = path.split('/');
    parts.next();
    parts
}

/// The name of a `{param}` segment.
fn param_name(segment: &str) -> Option<&str> {
    segment.strip_prefix('{').and_then(|s| s.strip_suffix('}'))
}

/// A path's shape: its segments, each `{param}` one as the same placeholder, so two
/// patterns that differ only in their parameters' names compare equal.
fn shape(path: &str) -> impl Iterator<Item = &str> + '_ {
    segments(path).map(|s| if s.starts_with('{') { "{}" } else { s })
}

fn shape_hash(method: Method, path: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    method_slot(method).hash(&mut hasher);
    shape(path).for_each(|segment| segment.hash(&mut hasher));
    hasher.finish()
}

/// The matching order's key: segment by segment, a literal (01) before a `{param}`
/// (10), and a path that ends (00) before a longer one; so a literal segment wins
/// over a parameter wherever they first differ. Two bits per segment, the first 64.
fn matching_order(path: &str) -> u128 {
    segments(path)
        .take(64)
        .enumerate()
        .fold(0, |key, (at, segment)| {
            let kind: u128 = if segment.starts_with('{') { 0b10 } else { 0b01 };
            key | kind << (126 - 2 * at)
        })
}

impl Router {
    /// Indexes the endpoints `listener` serves. Two endpoints with one method and path
    /// (after normalising `{param}` names) are a configuration error.
    pub fn new<C, U>(endpoints: &[Endpoint<C, U>], listener: Listener) -> Result<Router, String> {
        let claimed_twice = |first: usize, second: usize| {
            let (first, second) = (&endpoints[first].spec, &endpoints[second].spec);
            format!(
                "endpoints '{}' and '{}' both claim {} {}",
                first.id,
                second.id,
                second.method.as_str(),
                second.path
            )
        };
        let mut exact: HashMap<String, [Option<u32>; 3]> = HashMap::new();
        let mut patterns: Vec<(u128, Method, String, usize)> = Vec::new();
        for (index, ep) in endpoints.iter().enumerate() {
            let spec = &ep.spec;
            // A declared endpoint that is not served is routed too: the dispatcher
            // answers it 404 `endpoint_disabled` (rule `build:unavailable`), as a
            // disabled endpoint, rather than "Not found".
            if spec.listener != listener {
                continue;
            }
            let path = normalise(&spec.path);
            if path.contains('{') {
                patterns.push((matching_order(path), spec.method, path.to_string(), index));
                continue;
            }
            let slot = &mut exact.entry(path.to_string()).or_default()[method_slot(spec.method)];
            if let Some(first) = *slot {
                return Err(claimed_twice(first as usize, index));
            }
            *slot = Some(index as u32);
        }
        // Patterns with one shape, grouped by hash; each group compared in full, in
        // table order, so a collision is never taken for a duplicate.
        let mut by_shape: Vec<(u64, usize)> = patterns
            .iter()
            .enumerate()
            .map(|(at, (_, method, path, _))| (shape_hash(*method, path), at))
            .collect();
        by_shape.sort_unstable();
        for group in by_shape.chunk_by(|a, b| a.0 == b.0) {
            for (i, &(_, a)) in group.iter().enumerate() {
                for &(_, b) in &group[i + 1..] {
                    let (a, b) = (&patterns[a], &patterns[b]);
                    if a.1 == b.1 && shape(&a.2).eq(shape(&b.2)) {
                        return Err(claimed_twice(a.3.min(b.3), a.3.max(b.3)));
                    }
                }
            }
        }
        // Literal segments win over `{param}` ones (`/v1/agents/sessions/{id}` before
        // `/v1/agents/{agent_id}/versions`), whatever order the table declares them in.
        // The sort is stable and the patterns were pushed in table order, so equal
        // shapes keep it.
        patterns.sort_by_key(|pattern| pattern.0);
        let patterns = patterns
            .into_iter()
            .map(|(_, method, path, index)| (method, path, index))
            .collect();
        Ok(Router { exact, patterns })
    }

    /// Finds the endpoint serving `method path`; `path` is already trailing-slash stripped.
    pub fn lookup(&self, method: Method, path: &str) -> Option<RouteMatch> {
        if let Some(index) = self
            .exact
            .get(path)
            .and_then(|slots| slots[method_slot(method)])
        {
            return Some(RouteMatch {
                index: index as usize,
                params: Vec::new(),
            });
        }
        'patterns: for (m, pattern, index) in &self.patterns {
            if *m != method {
                continue;
            }
            let mut parts = segments(path);
            let mut params = Vec::new();
            for segment in segments(pattern) {
                let Some(part) = parts.next() else {
                    continue 'patterns;
                };
                match param_name(segment) {
                    None if segment == part => {}
                    None => continue 'patterns,
                    Some(_) if part.is_empty() => continue 'patterns,
                    Some(name) => params.push((name.to_string(), percent_decode(part))),
                }
            }
            if parts.next().is_none() {
                return Some(RouteMatch {
                    index: *index,
                    params,
                });
            }
        }
        None
    }
}

fn normalise(path: &str) -> &str {
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() {
        "/"
    } else {
        trimmed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Group;
    use crate::app::state::{handler, Endpoint};
    use crate::http::Response;

    fn ep(method: Method, path: &'static str) -> Endpoint {
        Endpoint::new(
            method,
            path,
            Group::Core,
            handler(|_| async { Ok(Response::ok(&1)) }),
        )
    }

    #[test]
    fn exact_and_param_routes() {
        let table = vec![
            ep(Method::Get, "/health"),
            ep(Method::Get, "/process/{pid}"),
            ep(Method::Post, "/process/{pid}/signal"),
            ep(Method::Get, "/process/list"),
        ];
        let router = Router::new(&table, Listener::Api).unwrap();
        assert_eq!(router.lookup(Method::Get, "/health").unwrap().index, 0);
        assert!(router.lookup(Method::Post, "/health").is_none());
        let m = router.lookup(Method::Get, "/process/42").unwrap();
        assert_eq!((m.index, m.params[0].1.as_str()), (1, "42"));
        assert_eq!(
            router
                .lookup(Method::Post, "/process/7/signal")
                .unwrap()
                .index,
            2
        );
        assert_eq!(
            router.lookup(Method::Get, "/process/list").unwrap().index,
            3
        );
        assert!(router.lookup(Method::Get, "/process/42/extra").is_none());
        assert!(router.lookup(Method::Get, "/process").is_none());
        let m = router.lookup(Method::Get, "/process/a%20b").unwrap();
        assert_eq!(m.params[0].1, "a b");
    }

    #[test]
    fn literal_segments_win_over_parameters() {
        let table = vec![
            ep(Method::Get, "/v1/agents/{agent_id}/versions"),
            ep(Method::Get, "/v1/agents/sessions/{session_id}"),
            ep(Method::Get, "/v1/agents/{agent_id}"),
        ];
        let router = Router::new(&table, Listener::Api).unwrap();
        let m = router
            .lookup(Method::Get, "/v1/agents/sessions/versions")
            .unwrap();
        assert_eq!((m.index, m.params[0].1.as_str()), (1, "versions"));
        assert_eq!(
            router
                .lookup(Method::Get, "/v1/agents/a1/versions")
                .unwrap()
                .index,
            0
        );
        assert_eq!(
            router.lookup(Method::Get, "/v1/agents/a1").unwrap().index,
            2
        );
    }

    #[test]
    fn one_method_and_path_per_endpoint() {
        let table = vec![
            ep(Method::Get, "/a/{x}"),
            ep(Method::Get, "/a/{y}").id("other"),
        ];
        assert!(Router::new(&table, Listener::Api).is_err());
        let table = vec![ep(Method::Get, "/a"), ep(Method::Post, "/a")];
        assert!(Router::new(&table, Listener::Api).is_ok());
        let table = vec![ep(Method::Get, "/a/"), ep(Method::Get, "/a").id("other")];
        assert!(Router::new(&table, Listener::Api).is_err());
        // Apart in the table, with other patterns between them: still one claim too many,
        // named in table order.
        let table = vec![
            ep(Method::Get, "/b/{x}/c").id("first"),
            ep(Method::Get, "/b/{x}"),
            ep(Method::Post, "/b/{y}/c"),
            ep(Method::Get, "/b/{z}/c").id("third"),
        ];
        let error = Router::new(&table, Listener::Api).err().unwrap();
        assert_eq!(
            error,
            "endpoints 'first' and 'third' both claim GET /b/{z}/c"
        );
    }
}
