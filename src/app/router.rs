//! Path matching compiled from the route table: exact paths by hash lookup, `{param}`
//! patterns segment by segment.

use std::collections::HashMap;

use super::endpoint::Endpoint;
use super::request::percent_decode;
use crate::api::{Listener, Method};

enum Segment {
    Literal(String),
    Param(String),
}

/// The dispatch index over a table of endpoints.
pub struct Router {
    /// Keyed by path alone so a lookup borrows the request's path without allocating.
    exact: HashMap<String, Vec<(Method, usize)>>,
    patterns: Vec<(Method, Vec<Segment>, usize)>,
}

/// A successful lookup: the endpoint's index and its decoded path parameters.
pub struct RouteMatch {
    pub index: usize,
    pub params: Vec<(String, String)>,
}

impl Router {
    /// Indexes the endpoints `listener` serves. Two endpoints with one method and path
    /// (after normalising `{param}` names) are a configuration error.
    pub fn new<C, U>(endpoints: &[Endpoint<C, U>], listener: Listener) -> Result<Router, String> {
        let mut exact: HashMap<String, Vec<(Method, usize)>> = HashMap::new();
        let mut patterns: Vec<(Method, Vec<Segment>, usize)> = Vec::new();
        let mut seen: HashMap<(Method, String), usize> = HashMap::new();
        for (index, ep) in endpoints.iter().enumerate() {
            let spec = &ep.spec;
            // A declared endpoint that is not served is routed too: the dispatcher
            // answers it 404 `endpoint_disabled` (rule `build:unavailable`), as a
            // disabled endpoint, rather than "Not found".
            if spec.listener != listener {
                continue;
            }
            let path = normalise(&spec.path);
            let shape = path
                .split('/')
                .map(|s| if s.starts_with('{') { "{}" } else { s })
                .collect::<Vec<_>>()
                .join("/");
            if let Some(first) = seen.insert((spec.method, shape), index) {
                return Err(format!(
                    "endpoints '{}' and '{}' both claim {} {}",
                    endpoints[first].spec.id,
                    spec.id,
                    spec.method.as_str(),
                    spec.path
                ));
            }
            if !path.contains('{') {
                exact.entry(path).or_default().push((spec.method, index));
                continue;
            }
            let segments = path
                .split('/')
                .skip(1)
                .map(
                    |s| match s.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                        Some(name) => Segment::Param(name.to_string()),
                        None => Segment::Literal(s.to_string()),
                    },
                )
                .collect();
            patterns.push((spec.method, segments, index));
        }
        // Literal segments win over `{param}` ones (`/v1/agents/sessions/{id}` before
        // `/v1/agents/{agent_id}/versions`), whatever order the table declares them in.
        // Compared in place: a key built per comparison allocated O(n log n) vectors.
        // The sort is stable and the patterns were pushed in table order, so equal
        // shapes keep it.
        fn shape(segments: &[Segment]) -> impl Iterator<Item = bool> + '_ {
            segments.iter().map(|s| matches!(s, Segment::Param(_)))
        }
        patterns.sort_by(|(_, a, _), (_, b, _)| shape(a).cmp(shape(b)));
        Ok(Router { exact, patterns })
    }

    /// Finds the endpoint serving `method path`; `path` is already trailing-slash stripped.
    pub fn lookup(&self, method: Method, path: &str) -> Option<RouteMatch> {
        if let Some(&(_, index)) = self
            .exact
            .get(path)
            .and_then(|slot| slot.iter().find(|(m, _)| *m == method))
        {
            return Some(RouteMatch {
                index,
                params: Vec::new(),
            });
        }
        'patterns: for (m, segments, index) in &self.patterns {
            if *m != method {
                continue;
            }
            let mut parts = path.split('/').skip(1);
            let mut params = Vec::new();
            for segment in segments {
                let Some(part) = parts.next() else {
                    continue 'patterns;
                };
                match segment {
                    Segment::Literal(lit) if lit == part => {}
                    Segment::Literal(_) => continue 'patterns,
                    Segment::Param(_) if part.is_empty() => continue 'patterns,
                    Segment::Param(name) => params.push((name.clone(), percent_decode(part))),
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

fn normalise(path: &str) -> String {
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() {
        "/".into()
    } else {
        trimmed.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Group;
    use crate::app::state::{handler, Endpoint};
    use crate::http::Response;

    fn ep(method: Method, path: &str) -> Endpoint {
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
    }
}
