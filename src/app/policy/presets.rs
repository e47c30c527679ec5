//! Named starting points for a policy (`preset:` in the document). A preset switches
//! endpoints on or off below the document's own `groups` and `endpoints` rules, which
//! can still change any of them; its decisions carry the rule `preset:<name>`.

use crate::api::{Effect, EndpointSpec};

/// The presets a document may name.
pub const PRESETS: [&str; 3] = ["default", "locked-down", "read-only"];

/// Whether preset `name` switches `endpoint` on or off (`None`: it leaves it alone).
/// What each preset does with an endpoint is part of its declaration
/// ([`EndpointSpec::kept_locked_down`], [`EndpointSpec::effect`]): `locked-down` leaves
/// core, reading files and named commands on; `read-only` turns off every route that
/// writes a file, starts a program, changes the environment or navigates.
pub fn decide(name: &str, endpoint: &EndpointSpec) -> Option<bool> {
    match name {
        "locked-down" => Some(endpoint.kept_locked_down),
        "read-only" => (endpoint.effect == Effect::Changes).then_some(false),
        _ => None,
    }
}
