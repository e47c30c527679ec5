//! Reading the nested JSON objects of Agents API bodies (a saved agent's `tools`, an
//! environment's `files`, a credential's `auth`) field by field, each refusal naming
//! the field's whole path in `param` (`tools[2].transport.server_url`,
//! `agent.reasoning.effort`): the routes' declarations check only the top level.
//!
//! `null` counts as absent, as it does for top-level fields; a key no reader asked
//! for is refused ([`Fields::done`]), so a field that cannot be honoured is never
//! accepted and ignored.

use serde_json::{Map, Value};

use super::error::AgentError;

/// One JSON object of a body, at path `at`, whose fields are read one by one.
pub struct Fields<'a> {
    map: &'a Map<String, Value>,
    at: String,
    read: Vec<&'static str>,
}

/// `at.key` (or `key` at the top).
pub fn join(at: &str, key: &str) -> String {
    if at.is_empty() || at.ends_with('.') {
        format!("{at}{key}")
    } else {
        format!("{at}.{key}")
    }
}

/// `at[i]`.
pub fn index(at: &str, i: usize) -> String {
    format!("{at}[{i}]")
}

/// 400 `invalid_request_error` naming `param`.
pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> AgentError {
    AgentError::invalid(param, message)
}

/// 400 `unsupported_parameter`: a value this server cannot honour.
pub fn unsupported(param: impl Into<String>, message: impl Into<String>) -> AgentError {
    AgentError::Unsupported {
        param: param.into(),
        message: message.into(),
    }
}

impl<'a> Fields<'a> {
    /// `value` as an object at `at`.
    pub fn of(value: &'a Value, at: &str) -> Result<Fields<'a>, AgentError> {
        match value {
            Value::Object(map) => Ok(Fields::new(map, at)),
            _ => Err(invalid(at, format!("{at} must be an object."))),
        }
    }

    pub fn new(map: &'a Map<String, Value>, at: &str) -> Fields<'a> {
        Fields {
            map,
            at: at.to_string(),
            read: Vec::new(),
        }
    }

    /// The path of field `key`.
    pub fn param(&self, key: &str) -> String {
        join(&self.at, key)
    }

    /// The raw value (`None` when absent or null), marked as read.
    pub fn get(&mut self, key: &'static str) -> Option<&'a Value> {
        self.read.push(key);
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// Whether the key is present, null included (update bodies tell null from absent).
    pub fn has(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    pub fn string(&mut self, key: &'static str) -> Result<Option<String>, AgentError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(invalid(
                self.param(key),
                format!("{} must be a string.", self.param(key)),
            )),
        }
    }

    pub fn required_string(&mut self, key: &'static str) -> Result<String, AgentError> {
        self.string(key)?
            .ok_or_else(|| invalid(self.param(key), format!("{} is required.", self.param(key))))
    }

    /// A string of 1 to `max` characters.
    pub fn bounded_string(
        &mut self,
        key: &'static str,
        max: usize,
    ) -> Result<Option<String>, AgentError> {
        match self.string(key)? {
            Some(s) if s.is_empty() || s.chars().count() > max => Err(invalid(
                self.param(key),
                format!("{} must hold 1 to {max} characters.", self.param(key)),
            )),
            other => Ok(other),
        }
    }

    pub fn bool(&mut self, key: &'static str) -> Result<Option<bool>, AgentError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(invalid(
                self.param(key),
                format!("{} must be a boolean.", self.param(key)),
            )),
        }
    }

    pub fn uint(
        &mut self,
        key: &'static str,
        low: u64,
        high: u64,
    ) -> Result<Option<u64>, AgentError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if (low..=high).contains(&n) => Ok(Some(n)),
                _ => Err(invalid(
                    self.param(key),
                    format!(
                        "{} must be a whole number from {low} to {high}.",
                        self.param(key)
                    ),
                )),
            },
        }
    }

    /// One of `choices`.
    pub fn choice(
        &mut self,
        key: &'static str,
        choices: &[&str],
    ) -> Result<Option<String>, AgentError> {
        match self.string(key)? {
            Some(s) if !choices.contains(&s.as_str()) => Err(invalid(
                self.param(key),
                format!("{} must be one of {}.", self.param(key), choices.join(", ")),
            )),
            other => Ok(other),
        }
    }

    pub fn object(&mut self, key: &'static str) -> Result<Option<Fields<'a>>, AgentError> {
        let param = self.param(key);
        self.get(key).map(|v| Fields::of(v, &param)).transpose()
    }

    /// A JSON object kept as it is (a schema, request metadata).
    pub fn raw_object(
        &mut self,
        key: &'static str,
    ) -> Result<Option<Map<String, Value>>, AgentError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(map.clone())),
            Some(_) => Err(invalid(
                self.param(key),
                format!("{} must be an object.", self.param(key)),
            )),
        }
    }

    pub fn array(&mut self, key: &'static str) -> Result<Option<&'a Vec<Value>>, AgentError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(list)) => Ok(Some(list)),
            Some(_) => Err(invalid(
                self.param(key),
                format!("{} must be a list.", self.param(key)),
            )),
        }
    }

    /// A list of strings.
    pub fn strings(&mut self, key: &'static str) -> Result<Option<Vec<String>>, AgentError> {
        let Some(list) = self.array(key)? else {
            return Ok(None);
        };
        list.iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s.clone()),
                _ => Err(invalid(
                    index(&self.param(key), i),
                    format!("{} must be a string.", index(&self.param(key), i)),
                )),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// An object of strings.
    pub fn string_map(
        &mut self,
        key: &'static str,
    ) -> Result<Option<Map<String, Value>>, AgentError> {
        let Some(map) = self.raw_object(key)? else {
            return Ok(None);
        };
        if let Some((k, _)) = map.iter().find(|(_, v)| !v.is_string()) {
            let param = join(&self.param(key), k);
            return Err(invalid(param.clone(), format!("{param} must be a string.")));
        }
        Ok(Some(map))
    }

    /// Refuses every key no reader asked for (null ones pass: null counts as absent).
    pub fn done(self) -> Result<(), AgentError> {
        let extra = self
            .map
            .iter()
            .find(|(k, v)| !v.is_null() && !self.read.contains(&k.as_str()));
        match extra {
            Some((key, _)) => {
                let param = join(&self.at, key);
                Err(unsupported(
                    param.clone(),
                    format!("Unsupported parameter: '{param}' is not a field this server knows."),
                ))
            }
            None => Ok(()),
        }
    }
}

/// `metadata` at `param`: at most 16 strings, keys up to 64 and values up to 512
/// characters (`{}` when absent or null).
pub fn metadata(value: Option<&Value>, param: &str) -> Result<Value, AgentError> {
    match value {
        None | Some(Value::Null) => Ok(Value::Object(Map::new())),
        Some(Value::Object(map)) => {
            let fits = map.len() <= 16
                && map.iter().all(|(k, v)| {
                    !k.is_empty()
                        && k.chars().count() <= 64
                        && v.as_str().is_some_and(|s| s.chars().count() <= 512)
                });
            if !fits {
                return Err(invalid(param, format!("{param} holds at most 16 string values, keys of 1 to 64 and values up to 512 characters.")));
            }
            Ok(Value::Object(map.clone()))
        }
        Some(_) => Err(invalid(
            param,
            format!("{param} must be an object of strings."),
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn refusals_name_the_whole_path() {
        let value = json!({"a": 1, "b": {"c": "x"}, "n": null, "extra": true});
        let mut f = Fields::of(&value, "tools[0]").unwrap();
        assert!(f.string("a").is_err());
        let mut b = f.object("b").unwrap().unwrap();
        assert_eq!(
            b.choice("c", &["y"]).unwrap_err().param(),
            Some("tools[0].b.c")
        );
        assert_eq!(f.string("n").unwrap(), None);
        match f.done() {
            Err(AgentError::Unsupported { param, .. }) => assert_eq!(param, "tools[0].extra"),
            other => panic!("{other:?}"),
        }
        assert!(metadata(Some(&json!({"k": "v"})), "metadata").is_ok());
        assert!(metadata(Some(&json!({"k": 1})), "metadata").is_err());
        let many: Map<String, Value> = (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
        assert!(metadata(Some(&Value::Object(many)), "metadata").is_err());
    }
}
