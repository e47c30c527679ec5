//! The reference server's ids for the agents routes both servers serve at the same
//! method and path (its `endpoints.py` is the table), so a policy written for it
//! names the same endpoints here. Each route keeps the id it had here before as a
//! former id ([`crate::app::Endpoint::renamed`]).

use crate::app::Endpoint;

/// (method, path with every `{name}` written `{}`, the reference's id).
const REFERENCE_IDS: [(&str, &str, &str); 52] = [
    ("GET", "/v1/agents/runtimes", "agents_runtimes_list"),
    ("GET", "/v1/models", "agents_models_list"),
    ("GET", "/v1/models/{}", "agents_models_get"),
    ("DELETE", "/v1/models/{}", "agents_cannot_models_delete"),
    ("POST", "/v1/responses", "agents_responses_create"),
    ("GET", "/v1/responses/{}", "agents_responses_get"),
    ("DELETE", "/v1/responses/{}", "agents_responses_delete"),
    ("POST", "/v1/responses/{}/cancel", "agents_responses_cancel"),
    (
        "GET",
        "/v1/responses/{}/input_items",
        "agents_responses_input_items",
    ),
    (
        "POST",
        "/v1/responses/input_tokens",
        "agents_cannot_responses_input_tokens",
    ),
    ("POST", "/v1/agents", "agents_definitions_create"),
    ("GET", "/v1/agents", "agents_definitions_list"),
    ("GET", "/v1/agents/{}", "agents_definitions_get"),
    ("POST", "/v1/agents/{}", "agents_definitions_update"),
    ("DELETE", "/v1/agents/{}", "agents_definitions_delete"),
    (
        "POST",
        "/v1/agents/environments",
        "agents_environments_create",
    ),
    ("GET", "/v1/agents/environments", "agents_environments_list"),
    (
        "GET",
        "/v1/agents/environments/{}",
        "agents_environments_get",
    ),
    (
        "POST",
        "/v1/agents/environments/{}/files",
        "agents_environment_files_create",
    ),
    (
        "GET",
        "/v1/agents/environments/{}/files",
        "agents_environment_files_list",
    ),
    (
        "POST",
        "/v1/agents/environments/templates",
        "agents_environment_templates_create",
    ),
    (
        "GET",
        "/v1/agents/environments/templates",
        "agents_environment_templates_list",
    ),
    (
        "GET",
        "/v1/agents/environments/templates/{}",
        "agents_environment_templates_get",
    ),
    (
        "POST",
        "/v1/agents/environments/templates/{}",
        "agents_environment_templates_update",
    ),
    (
        "DELETE",
        "/v1/agents/environments/templates/{}",
        "agents_environment_templates_delete",
    ),
    ("POST", "/v1/vaults", "agents_vaults_create"),
    ("GET", "/v1/vaults", "agents_vaults_list"),
    ("GET", "/v1/vaults/{}", "agents_vaults_get"),
    ("POST", "/v1/vaults/{}", "agents_vaults_update"),
    ("DELETE", "/v1/vaults/{}", "agents_vaults_delete"),
    (
        "POST",
        "/v1/vaults/{}/credentials",
        "agents_vault_credentials_create",
    ),
    (
        "GET",
        "/v1/vaults/{}/credentials",
        "agents_vault_credentials_list",
    ),
    (
        "GET",
        "/v1/vaults/{}/credentials/{}",
        "agents_vault_credentials_get",
    ),
    (
        "POST",
        "/v1/vaults/{}/credentials/{}",
        "agents_vault_credentials_update",
    ),
    (
        "DELETE",
        "/v1/vaults/{}/credentials/{}",
        "agents_vault_credentials_delete",
    ),
    (
        "POST",
        "/v1/agents/sessions/{}/events",
        "agents_sessions_events_create",
    ),
    (
        "GET",
        "/v1/agents/sessions/{}/events",
        "agents_sessions_events_stream",
    ),
    (
        "GET",
        "/v1/agents/sessions/{}/items",
        "agents_sessions_items_list",
    ),
    (
        "GET",
        "/v1/agents/sessions/{}/turns",
        "agents_sessions_turns_list",
    ),
    (
        "GET",
        "/v1/agents/sessions/{}/turns/{}",
        "agents_sessions_turns_get",
    ),
    (
        "GET",
        "/v1/agents/sessions/{}/turns/{}/items",
        "agents_sessions_turns_items_list",
    ),
    (
        "GET",
        "/v1/agents/sessions/{}/subagents",
        "agents_subagents_list",
    ),
    (
        "GET",
        "/v1/agents/sessions/{}/subagents/{}",
        "agents_subagents_get",
    ),
    (
        "GET",
        "/v1/agents/sessions/{}/subagents/{}/items",
        "agents_subagents_items_list",
    ),
    (
        "GET",
        "/v1/agents/sessions/{}/subagents/{}/turns",
        "agents_subagents_turns_list",
    ),
    (
        "GET",
        "/v1/agents/sessions/{}/subagents/{}/turns/{}",
        "agents_subagents_turns_get",
    ),
    (
        "GET",
        "/v1/agents/sessions/{}/subagents/{}/turns/{}/items",
        "agents_subagents_turns_items_list",
    ),
    (
        "GET",
        "/v1/agents/sessions/{}/artifacts",
        "agents_artifacts_list",
    ),
    (
        "GET",
        "/v1/agents/sessions/{}/artifacts/{}",
        "agents_artifacts_get",
    ),
    (
        "DELETE",
        "/v1/agents/sessions/{}/artifacts/{}",
        "agents_artifacts_delete",
    ),
    (
        "GET",
        "/v1/agents/sessions/{}/artifacts/{}/content",
        "agents_artifacts_content",
    ),
    ("GET", "/v1/agents/sessions/{}/traces", "agents_traces_list"),
];

/// Gives every route the reference serves too the reference's id.
pub fn adopt(endpoints: Vec<Endpoint>) -> Vec<Endpoint> {
    endpoints
        .into_iter()
        .map(|endpoint| {
            let path = unnamed(&endpoint.spec.path);
            let method = endpoint.spec.method.as_str();
            match REFERENCE_IDS
                .iter()
                .find(|(m, p, _)| *m == method && *p == path)
            {
                Some((_, _, id)) => endpoint.renamed(*id),
                None => endpoint,
            }
        })
        .collect()
}

/// `path` with the names of its parameters left out (`/v1/vaults/{}`).
fn unnamed(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut in_name = false;
    for c in path.chars() {
        match c {
            '{' => {
                in_name = true;
                out.push_str("{}");
            }
            '}' => in_name = false,
            _ if in_name => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_reference_id_names_one_route() {
        let endpoints = super::super::endpoints();
        for (method, path, id) in super::REFERENCE_IDS {
            let found: Vec<_> = endpoints.iter().filter(|e| e.spec.id == id).collect();
            assert_eq!(found.len(), 1, "{method} {path} {id}");
            assert!(
                !found[0].spec.aliases.is_empty(),
                "{id} keeps its former id"
            );
        }
    }
}
