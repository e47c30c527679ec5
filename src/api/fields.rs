//! Declared request fields: one [`Param`] per query, body or path field of an endpoint
//! (name, type, required, default, bounds, doc) and [`parse`], the one reader of them.
//! The same list is the endpoint's `params` in `/capabilities`, its OpenAPI schema and
//! its MCP tool's `inputSchema`, so what a route documents and what it accepts cannot
//! drift apart.
//!
//! Errors come out in the endpoint's [`ErrorStyle`]: the contract's `ValueError`
//! sentences (`command is required`, `cwd must be a string`), or OpenAI's
//! `invalid_request_error` naming the field in `param`. A field whose wording the
//! contract pins carries it (`.missing(..)`, `.invalid(..)`), so conformance texts stay
//! byte-identical while the rule itself lives in the declaration.

use serde_json::{json, Map, Value};

use super::error::{ApiError, ErrorStyle};

/// The JSON type a field takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    String,
    Integer,
    Number,
    Boolean,
    Object,
    /// An object whose values are all strings (`env`, `metadata`).
    StringMap,
    Array,
    /// Every JSON value (`evaluate`'s `arg`).
    Any,
}

impl Kind {
    /// Parses a JSON Schema type name (`"string"`, ...; `"any"` for [`Kind::Any`]).
    pub fn from_name(name: &str) -> Kind {
        match name {
            "string" => Kind::String,
            "integer" => Kind::Integer,
            "number" => Kind::Number,
            "boolean" => Kind::Boolean,
            "object" => Kind::Object,
            "string_map" => Kind::StringMap,
            "array" => Kind::Array,
            "any" => Kind::Any,
            other => panic!("unknown field type '{other}' in a route declaration"),
        }
    }

    /// The JSON Schema type name (`any` for [`Kind::Any`]); a string map is an object.
    pub fn name(self) -> &'static str {
        match self {
            Kind::String => "string",
            Kind::Integer => "integer",
            Kind::Number => "number",
            Kind::Boolean => "boolean",
            Kind::Object | Kind::StringMap => "object",
            Kind::Array => "array",
            Kind::Any => "any",
        }
    }

    /// How an error sentence names the type: `cwd must be a string`.
    fn article(self) -> &'static str {
        match self {
            Kind::String => "a string",
            Kind::Integer => "an integer",
            Kind::Number => "a number",
            Kind::Boolean => "a boolean",
            Kind::Object => "an object",
            Kind::StringMap => "an object of strings",
            Kind::Array => "a list",
            Kind::Any => "a JSON value",
        }
    }
}

/// Where a parameter travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamIn {
    Query,
    Body,
    Path,
}

impl ParamIn {
    pub fn name(self) -> &'static str {
        match self {
            ParamIn::Query => "query",
            ParamIn::Body => "body",
            ParamIn::Path => "path",
        }
    }
}

/// One field of an endpoint's request.
#[derive(Clone, Debug)]
pub struct Param {
    pub name: &'static str,
    pub location: ParamIn,
    pub kind: Kind,
    pub required: bool,
    /// The value an absent (or `null`) field takes, as JSON text.
    pub default: Option<&'static str>,
    /// Inclusive bounds of a number (or of a string's length in characters).
    pub minimum: Option<f64>,
    pub maximum: Option<f64>,
    /// `minimum` itself is refused (`timeout` must be above 0).
    pub exclusive_minimum: bool,
    /// The only values a string may take.
    pub choices: &'static [&'static str],
    /// A blank string (only whitespace) counts as absent (`command`).
    pub blank_is_absent: bool,
    /// A value of the wrong type or out of bounds counts as absent instead of being
    /// refused (the contract's `/shell` `timeout`: anything but a positive number is the
    /// default).
    pub lenient: bool,
    pub doc: &'static str,
    /// The sentence for a required field that is absent (default `<name> is required`).
    pub missing: Option<&'static str>,
    /// The sentence for a value of the wrong type or out of bounds (default `<name> must
    /// be <type>`, with the bounds when there are any).
    pub invalid: Option<&'static str>,
    /// The sentence for a value of the wrong JSON type (or query text that does not
    /// parse), when it differs from `invalid`'s.
    pub wrong_type: Option<&'static str>,
    /// An integer read as Python's `int()` reads it: integral floats truncated, numeric
    /// strings, booleans as 0 and 1, and `null` refused as `int(None)` is (the
    /// contract's `/files/search` limits).
    pub python_int: bool,
}

impl Param {
    fn new(name: &'static str, location: ParamIn, kind: &str, required: bool) -> Param {
        Param {
            name,
            location,
            kind: Kind::from_name(kind),
            required,
            default: None,
            minimum: None,
            maximum: None,
            exclusive_minimum: false,
            choices: &[],
            blank_is_absent: false,
            lenient: false,
            doc: "",
            missing: None,
            invalid: None,
            wrong_type: None,
            python_int: false,
        }
    }

    /// A query parameter of JSON type `kind` (`"string"`, `"integer"`, ...).
    pub fn query(name: &'static str, kind: &str, required: bool) -> Param {
        Param::new(name, ParamIn::Query, kind, required)
    }

    /// A field of the JSON body of JSON type `kind`.
    pub fn body(name: &'static str, kind: &str, required: bool) -> Param {
        Param::new(name, ParamIn::Body, kind, required)
    }

    /// A `{name}` segment of the path.
    pub fn path(name: &'static str) -> Param {
        Param::new(name, ParamIn::Path, "string", true)
    }

    /// The value taken when the field is absent, as JSON text (`"30"`, `"\"desc\""`).
    pub fn default(mut self, json: &'static str) -> Param {
        debug_assert!(serde_json::from_str::<Value>(json).is_ok(), "{json}");
        self.default = Some(json);
        self
    }

    /// Inclusive bounds.
    pub fn range(mut self, minimum: f64, maximum: f64) -> Param {
        self.minimum = Some(minimum);
        self.maximum = Some(maximum);
        self
    }

    pub fn at_least(mut self, minimum: f64) -> Param {
        self.minimum = Some(minimum);
        self
    }

    pub fn at_most(mut self, maximum: f64) -> Param {
        self.maximum = Some(maximum);
        self
    }

    /// Strictly greater than `minimum`.
    pub fn above(mut self, minimum: f64) -> Param {
        self.minimum = Some(minimum);
        self.exclusive_minimum = true;
        self
    }

    pub fn one_of(mut self, choices: &'static [&'static str]) -> Param {
        self.choices = choices;
        self
    }

    pub fn blank_is_absent(mut self) -> Param {
        self.blank_is_absent = true;
        self
    }

    pub fn lenient(mut self) -> Param {
        self.lenient = true;
        self
    }

    pub fn doc(mut self, doc: &'static str) -> Param {
        self.doc = doc;
        self
    }

    pub fn missing(mut self, sentence: &'static str) -> Param {
        self.missing = Some(sentence);
        self
    }

    pub fn invalid(mut self, sentence: &'static str) -> Param {
        self.invalid = Some(sentence);
        self
    }

    /// See [`Param::python_int`]; for integer fields.
    pub fn python_int(mut self) -> Param {
        debug_assert_eq!(self.kind, Kind::Integer);
        self.python_int = true;
        self
    }

    pub fn wrong_type(mut self, sentence: &'static str) -> Param {
        self.wrong_type = Some(sentence);
        self
    }

    /// The field's JSON Schema, for the OpenAPI document and MCP tools.
    pub fn schema(&self) -> Value {
        let mut schema = Map::new();
        match self.kind {
            Kind::Any => {}
            Kind::StringMap => {
                schema.insert("type".into(), json!("object"));
                schema.insert("additionalProperties".into(), json!({"type": "string"}));
            }
            kind => {
                schema.insert("type".into(), json!(kind.name()));
            }
        }
        let (low, high) = match self.kind {
            Kind::String => ("minLength", "maxLength"),
            _ => ("minimum", "maximum"),
        };
        if let Some(minimum) = self.minimum {
            let key = if self.exclusive_minimum && self.kind != Kind::String {
                "exclusiveMinimum"
            } else {
                low
            };
            schema.insert(key.into(), number(minimum));
        }
        if let Some(maximum) = self.maximum {
            schema.insert(high.into(), number(maximum));
        }
        if !self.choices.is_empty() {
            schema.insert("enum".into(), json!(self.choices));
        }
        if let Some(default) = self.default {
            if let Ok(value) = serde_json::from_str::<Value>(default) {
                schema.insert("default".into(), value);
            }
        }
        if !self.doc.is_empty() {
            schema.insert("description".into(), json!(self.doc));
        }
        Value::Object(schema)
    }

    /// The entry of `/capabilities`' `params` object.
    pub fn capability(&self) -> Value {
        let mut entry = json!({
            "in": self.location.name(),
            "type": self.kind.name(),
            "required": self.required,
        });
        if let Some(default) = self
            .default
            .and_then(|d| serde_json::from_str::<Value>(d).ok())
        {
            entry["default"] = default;
        }
        if let Some(minimum) = self.minimum {
            entry["minimum"] = number(minimum);
        }
        if let Some(maximum) = self.maximum {
            entry["maximum"] = number(maximum);
        }
        if !self.choices.is_empty() {
            entry["enum"] = json!(self.choices);
        }
        entry
    }

    fn refusal(&self, style: ErrorStyle, sentence: String) -> ApiError {
        refusal(style, self.name, sentence)
    }

    fn missing_error(&self, style: ErrorStyle) -> ApiError {
        let sentence = match self.missing {
            Some(s) => s.to_string(),
            None => format!("{} is required", self.name),
        };
        self.refusal(style, sentence)
    }

    fn type_error(&self, style: ErrorStyle) -> ApiError {
        match self.wrong_type {
            Some(sentence) => self.refusal(style, sentence.to_string()),
            None => self.invalid_error(style),
        }
    }

    fn invalid_error(&self, style: ErrorStyle) -> ApiError {
        let sentence = match self.invalid {
            Some(s) => s.to_string(),
            None if !self.choices.is_empty() => {
                format!("{} must be one of {}", self.name, self.choices.join(", "))
            }
            None => {
                let mut sentence = format!("{} must be {}", self.name, self.kind.article());
                match (self.minimum, self.maximum) {
                    (Some(low), Some(high)) => {
                        sentence.push_str(&format!(" from {low} to {high}"));
                    }
                    (Some(low), None) if self.exclusive_minimum => {
                        sentence.push_str(&format!(" above {low}"));
                    }
                    (Some(low), None) => sentence.push_str(&format!(" of at least {low}")),
                    (None, Some(high)) => sentence.push_str(&format!(" of at most {high}")),
                    (None, None) => {}
                }
                sentence
            }
        };
        self.refusal(style, sentence)
    }

    /// Checks one JSON value against the declaration: `Ok(None)` when it counts as
    /// absent.
    fn check(&self, value: Value, style: ErrorStyle) -> Result<Option<Value>, ApiError> {
        let value = match self.python_int && !value.is_null() {
            true => python_int(&value).ok_or_else(|| self.type_error(style))?,
            false => value,
        };
        let (type_fits, bounds_fit) = match (&value, self.kind) {
            (Value::Null, _) => return Ok(None),
            (Value::String(s), Kind::String) => {
                if self.blank_is_absent && s.trim().is_empty() {
                    return Ok(None);
                }
                let chars = s.chars().count() as f64;
                (
                    true,
                    self.within(chars) && (self.choices.is_empty() || self.choices.contains(&&**s)),
                )
            }
            (Value::Number(n), Kind::Integer) => (
                n.is_i64() || n.is_u64(),
                n.as_f64().is_some_and(|f| self.within(f)),
            ),
            (Value::Number(n), Kind::Number) => (true, n.as_f64().is_some_and(|f| self.within(f))),
            (Value::Bool(_), Kind::Boolean)
            | (Value::Object(_), Kind::Object)
            | (Value::Array(_), Kind::Array)
            | (_, Kind::Any) => (true, true),
            (Value::Object(map), Kind::StringMap) => (map.values().all(Value::is_string), true),
            _ => (false, false),
        };
        match (type_fits && bounds_fit, self.lenient) {
            (true, _) => Ok(Some(value)),
            (false, true) => Ok(None),
            (false, false) if !type_fits => Err(self.type_error(style)),
            (false, false) => Err(self.invalid_error(style)),
        }
    }

    fn within(&self, value: f64) -> bool {
        let above = match self.minimum {
            Some(low) if self.exclusive_minimum => value > low,
            Some(low) => value >= low,
            None => true,
        };
        above && self.maximum.is_none_or(|high| value <= high)
    }

    /// A query string value as the JSON value of the field's kind.
    fn read_text(&self, text: &str, style: ErrorStyle) -> Result<Value, ApiError> {
        let trimmed = text.trim();
        let parsed = match self.kind {
            Kind::Integer => trimmed.parse::<i64>().ok().map(Value::from),
            Kind::Number => trimmed
                .parse::<f64>()
                .ok()
                .filter(|f| f.is_finite())
                .map(Value::from),
            // The contract's truthy words; everything else is false.
            Kind::Boolean => Some(Value::Bool(matches!(
                trimmed.to_ascii_lowercase().as_str(),
                "1" | "true" | "yes" | "on"
            ))),
            _ => Some(Value::String(text.to_string())),
        };
        match parsed {
            Some(value) => Ok(value),
            None if self.lenient => Ok(Value::Null),
            None => Err(self.type_error(style)),
        }
    }
}

/// `int(value)` as Python computes it for a JSON value, or `None` where Python raises.
fn python_int(value: &Value) -> Option<Value> {
    match value {
        Value::Number(n) => n
            .as_i64()
            .or_else(|| {
                n.as_f64()
                    .filter(|f| f.is_finite())
                    .map(|f| f.trunc() as i64)
            })
            .map(Value::from),
        Value::Bool(b) => Some(Value::from(i64::from(*b))),
        Value::String(s) => s.trim().parse::<i64>().ok().map(Value::from),
        _ => None,
    }
}

fn number(value: f64) -> Value {
    if value.fract() == 0.0 && value.abs() < 9.0e15 {
        json!(value as i64)
    } else {
        json!(value)
    }
}

/// A 400 for field `name` in `style`: the contract's `ValueError`, or OpenAI's
/// `invalid_request_error` with `param` (its sentences end with a full stop).
pub fn refusal(style: ErrorStyle, name: &str, sentence: String) -> ApiError {
    match style {
        ErrorStyle::Contract | ErrorStyle::Connect | ErrorStyle::Envd => {
            ApiError::bad_request(sentence)
        }
        ErrorStyle::OpenAi => {
            let sentence = if sentence.ends_with('.') {
                sentence
            } else {
                sentence + "."
            };
            ApiError::new(400, "invalid_request_error", sentence)
                .with_field("param", name.to_string())
        }
    }
}

/// What to do with a body field no [`Param`] declares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum UnknownFields {
    /// Ignored, as the contract's Python server ignores them.
    #[default]
    Ignore,
    /// 400 `unsupported_parameter` naming it (a field that cannot be honoured is never
    /// silently dropped); `null` counts as absent.
    Refuse,
}

/// The declared fields of one request, checked, with defaults filled in.
#[derive(Debug, Default)]
pub struct Args {
    values: Vec<(&'static str, Value)>,
    /// Fields the caller sent a non-null value for (a lenient field may have been
    /// replaced by its default).
    sent: Vec<&'static str>,
    /// Fields whose value is their declared default.
    defaulted: Vec<&'static str>,
    /// The body fields no declaration names (kept for endpoints that read them).
    rest: Map<String, Value>,
}

impl Args {
    pub fn value(&self, name: &str) -> Option<&Value> {
        self.values.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// Moves a value out (a large string is not copied).
    pub fn take(&mut self, name: &str) -> Option<Value> {
        let at = self.values.iter().position(|(n, _)| *n == name)?;
        Some(self.values.swap_remove(at).1)
    }

    pub fn present(&self, name: &str) -> bool {
        self.value(name).is_some()
    }

    /// Whether the value is the caller's own (present and not the declared default).
    pub fn given(&self, name: &str) -> bool {
        self.present(name) && !self.defaulted.contains(&name)
    }

    /// Whether the caller sent a non-null value (even one a lenient field replaced).
    pub fn sent(&self, name: &str) -> bool {
        self.sent.contains(&name)
    }

    pub fn str(&self, name: &str) -> Option<&str> {
        self.value(name).and_then(Value::as_str)
    }

    /// A string field (empty when absent: a required one was checked).
    pub fn string(&self, name: &str) -> String {
        self.str(name).unwrap_or_default().to_string()
    }

    pub fn flag(&self, name: &str) -> bool {
        self.value(name).and_then(Value::as_bool).unwrap_or(false)
    }

    pub fn bool(&self, name: &str) -> Option<bool> {
        self.value(name).and_then(Value::as_bool)
    }

    pub fn int(&self, name: &str) -> Option<i64> {
        self.value(name).and_then(Value::as_i64)
    }

    pub fn uint(&self, name: &str) -> Option<u64> {
        self.value(name).and_then(Value::as_u64)
    }

    pub fn number(&self, name: &str) -> Option<f64> {
        self.value(name).and_then(Value::as_f64)
    }

    /// A string map field's entries, in the order sent.
    pub fn pairs(&self, name: &str) -> Vec<(String, String)> {
        match self.value(name) {
            Some(Value::Object(map)) => map
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Body fields no declaration names (only kept under [`UnknownFields::Ignore`]).
    pub fn rest(&self) -> &Map<String, Value> {
        &self.rest
    }
}

/// Reads `params` from the query pairs and the JSON object body: absent or `null`
/// fields take their default, required ones must be there, every value must fit its
/// declaration. Fields are checked in declaration order, so the first refusal names the
/// first bad field as a hand-written check would.
pub fn parse(
    params: &[Param],
    style: ErrorStyle,
    unknown: UnknownFields,
    query: &[(String, String)],
    body: Option<Map<String, Value>>,
) -> Result<Args, ApiError> {
    let mut body = body.unwrap_or_default();
    let mut args = Args::default();
    for param in params {
        let value = match param.location {
            ParamIn::Path => continue,
            ParamIn::Query => match query.iter().find(|(n, _)| n == param.name) {
                Some((_, text)) => param.read_text(text, style)?,
                None => Value::Null,
            },
            ParamIn::Body => match body.remove(param.name) {
                // `int(None)` raises: a sent `null` is refused, an absent field is not.
                Some(Value::Null) if param.python_int => return Err(param.type_error(style)),
                Some(value) => value,
                None => Value::Null,
            },
        };
        if !value.is_null() {
            args.sent.push(param.name);
        }
        let value = match param.check(value, style)? {
            Some(value) => Some(value),
            None => {
                let default = param.default.and_then(|d| serde_json::from_str(d).ok());
                if default.is_some() {
                    args.defaulted.push(param.name);
                }
                default
            }
        };
        match value {
            Some(value) => args.values.push((param.name, value)),
            None if param.required => return Err(param.missing_error(style)),
            None => {}
        }
    }
    if unknown == UnknownFields::Refuse {
        if let Some((key, _)) = body.iter().find(|(_, v)| !v.is_null()) {
            return Err(refusal(
                style,
                key,
                format!("Unsupported parameter: '{key}' is not a field of this endpoint."),
            )
            .with_code("unsupported_parameter"));
        }
    }
    args.rest = body;
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(json: Value) -> Option<Map<String, Value>> {
        match json {
            Value::Object(map) => Some(map),
            _ => None,
        }
    }

    fn shell_fields() -> Vec<Param> {
        vec![
            Param::body("command", "string", true).blank_is_absent(),
            Param::body("cwd", "string", false),
            Param::body("env", "string_map", false),
            Param::body("timeout", "number", false)
                .above(0.0)
                .lenient()
                .default("30"),
        ]
    }

    fn parse_contract(params: &[Param], json: Value) -> Result<Args, ApiError> {
        parse(
            params,
            ErrorStyle::Contract,
            UnknownFields::Ignore,
            &[],
            body(json),
        )
    }

    #[test]
    fn contract_sentences() {
        let fields = shell_fields();
        let err = parse_contract(&fields, json!({})).unwrap_err();
        assert_eq!(err.message, "command is required");
        let err = parse_contract(&fields, json!({"command": "  "})).unwrap_err();
        assert_eq!(err.message, "command is required");
        let err = parse_contract(&fields, json!({"command": 1})).unwrap_err();
        assert_eq!(err.message, "command must be a string");
        let err = parse_contract(&fields, json!({"command": "ls", "env": {"A": 1}})).unwrap_err();
        assert_eq!(err.message, "env must be an object of strings");
        assert_eq!(err.status, 400);
        assert_eq!(err.kind, "ValueError");
    }

    #[test]
    fn defaults_and_lenience() {
        let fields = shell_fields();
        let args = parse_contract(&fields, json!({"command": "ls", "timeout": -1})).unwrap();
        assert_eq!(args.number("timeout"), Some(30.0));
        let args = parse_contract(&fields, json!({"command": "ls", "timeout": 2.5})).unwrap();
        assert_eq!(args.number("timeout"), Some(2.5));
        let args = parse_contract(&fields, json!({"command": "ls", "cwd": null})).unwrap();
        assert!(!args.present("cwd"));
    }

    #[test]
    fn openai_style_names_the_param_and_refuses_unknown_fields() {
        let fields = vec![
            Param::body("model", "string", false),
            Param::body("order", "string", false).one_of(&["asc", "desc"]),
        ];
        let err = parse(
            &fields,
            ErrorStyle::OpenAi,
            UnknownFields::Refuse,
            &[],
            body(json!({"model": 3})),
        )
        .unwrap_err();
        assert_eq!(err.message, "model must be a string.");
        assert_eq!(err.kind, "invalid_request_error");
        assert!(err.has_field("param"));
        let err = parse(
            &fields,
            ErrorStyle::OpenAi,
            UnknownFields::Refuse,
            &[],
            body(json!({"tempo": 1, "ignored": null})),
        )
        .unwrap_err();
        assert_eq!(err.code, Some("unsupported_parameter"));
        let err = parse(
            &fields,
            ErrorStyle::OpenAi,
            UnknownFields::Refuse,
            &[],
            body(json!({"order": "sideways"})),
        )
        .unwrap_err();
        assert_eq!(err.message, "order must be one of asc, desc.");
    }

    #[test]
    fn query_values_take_their_kind() {
        let fields = vec![
            Param::query("limit", "integer", false)
                .range(1.0, 100.0)
                .default("20"),
            Param::query("recursive", "boolean", false),
        ];
        let query = vec![
            ("limit".to_string(), " 7 ".to_string()),
            ("recursive".to_string(), "Yes".to_string()),
        ];
        let args = parse(
            &fields,
            ErrorStyle::Contract,
            UnknownFields::Ignore,
            &query,
            None,
        )
        .unwrap();
        assert_eq!(args.int("limit"), Some(7));
        assert!(args.flag("recursive"));
        let query = vec![("limit".to_string(), "500".to_string())];
        let err = parse(
            &fields,
            ErrorStyle::Contract,
            UnknownFields::Ignore,
            &query,
            None,
        )
        .unwrap_err();
        assert_eq!(err.message, "limit must be an integer from 1 to 100");
        let args = parse(
            &fields,
            ErrorStyle::Contract,
            UnknownFields::Ignore,
            &[],
            None,
        )
        .unwrap();
        assert_eq!(args.int("limit"), Some(20));
    }

    #[test]
    fn python_ints_read_as_int_does() {
        let fields = vec![Param::body("max_depth", "integer", false)
            .python_int()
            .default("5")];
        let read = |json: Value| parse_contract(&fields, json).map(|a| a.int("max_depth"));
        assert_eq!(read(json!({})).unwrap(), Some(5));
        assert_eq!(read(json!({"max_depth": "3"})).unwrap(), Some(3));
        assert_eq!(read(json!({"max_depth": 3.9})).unwrap(), Some(3));
        assert_eq!(read(json!({"max_depth": true})).unwrap(), Some(1));
        let refused = read(json!({"max_depth": null})).unwrap_err();
        assert_eq!(refused.message, "max_depth must be an integer");
        assert!(read(json!({"max_depth": "deep"})).is_err());
        assert!(read(json!({"max_depth": [1]})).is_err());
    }

    #[test]
    fn schema_carries_bounds_default_and_doc() {
        let param = Param::query("limit", "integer", false)
            .range(1.0, 100.0)
            .default("20")
            .doc("How many to list.");
        assert_eq!(
            param.schema(),
            json!({"type": "integer", "minimum": 1, "maximum": 100, "default": 20, "description": "How many to list."})
        );
        let timeout = Param::body("timeout", "number", false).above(0.0);
        assert_eq!(
            timeout.schema(),
            json!({"type": "number", "exclusiveMinimum": 0})
        );
    }
}
