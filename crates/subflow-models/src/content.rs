//! Reading LangChain message content (a string or a list of blocks) into parts that each
//! provider writes in its own shape.

use serde_json::{Map, Value};

/// An image, by address or inline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Image {
    Url(String),
    Base64 { media_type: String, data: String },
}

impl Image {
    /// The image as one URL, inline images as a `data:` URL.
    pub fn to_url(&self) -> String {
        match self {
            Image::Url(url) => url.clone(),
            Image::Base64 { media_type, data } => format!("data:{media_type};base64,{data}"),
        }
    }
}

/// One piece of content.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Part {
    Text(String),
    Image(Image),
    /// A block of another kind, passed on unchanged so the provider can accept or reject it
    /// rather than have it vanish silently.
    Other(Value),
}

/// The parts of `content`; empty texts are dropped because providers reject them.
pub(crate) fn parts(content: &Value) -> Vec<Part> {
    let blocks: &[Value] = match content {
        Value::Array(blocks) => blocks,
        Value::Null => &[],
        single => std::slice::from_ref(single),
    };
    blocks
        .iter()
        .filter_map(|block| match block {
            Value::String(text) => Some(Part::Text(text.clone())),
            Value::Object(map) => Some(part(map, block)),
            _ => None,
        })
        .filter(|part| !matches!(part, Part::Text(text) if text.is_empty()))
        .collect()
}

fn part(map: &Map<String, Value>, block: &Value) -> Part {
    let text = |key: &str| map.get(key).and_then(Value::as_str).map(str::to_owned);
    match map.get("type").and_then(Value::as_str) {
        Some("text") => Part::Text(text("text").unwrap_or_default()),
        Some("image_url") => {
            let url = match map.get("image_url") {
                Some(Value::String(url)) => Some(url.as_str()),
                Some(Value::Object(inner)) => inner.get("url").and_then(Value::as_str),
                _ => None,
            };
            url.map_or_else(
                || Part::Other(block.clone()),
                |url| Part::Image(image_from_url(url)),
            )
        }
        Some("image") => image_block(map).map_or_else(|| Part::Other(block.clone()), Part::Image),
        _ => Part::Other(block.clone()),
    }
}

/// `image` blocks in LangChain's standard shapes (`source_type` + `url`/`data`, or
/// `url`/`base64`) and in Anthropic's own (`source: {type, media_type, data|url}`).
fn image_block(map: &Map<String, Value>) -> Option<Image> {
    let text = |map: &Map<String, Value>, key: &str| {
        map.get(key).and_then(Value::as_str).map(str::to_owned)
    };
    if let Some(Value::Object(source)) = map.get("source") {
        return match source.get("type").and_then(Value::as_str) {
            Some("base64") => Some(Image::Base64 {
                media_type: text(source, "media_type")?,
                data: text(source, "data")?,
            }),
            Some("url") => text(source, "url").map(|url| image_from_url(&url)),
            _ => None,
        };
    }
    let media_type = text(map, "mime_type").unwrap_or_else(|| "image/png".to_owned());
    if let Some(data) = text(map, "base64") {
        return Some(Image::Base64 { media_type, data });
    }
    match map.get("source_type").and_then(Value::as_str) {
        Some("base64") => Some(Image::Base64 {
            media_type,
            data: text(map, "data")?,
        }),
        _ => text(map, "url").map(|url| image_from_url(&url)),
    }
}

/// A URL, split into its parts when it is a base64 `data:` URL.
fn image_from_url(url: &str) -> Image {
    url.strip_prefix("data:")
        .and_then(|rest| rest.split_once(";base64,"))
        .map_or_else(
            || Image::Url(url.to_owned()),
            |(media_type, data)| Image::Base64 {
                media_type: media_type.to_owned(),
                data: data.to_owned(),
            },
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strings_blocks_and_image_shapes_become_parts() {
        let content = json!([
            "plain",
            {"type": "text", "text": "block"},
            {"type": "text", "text": ""},
            {"type": "image_url", "image_url": {"url": "https://x/cat.png"}},
            {"type": "image_url", "image_url": "data:image/jpeg;base64,AAAA"},
            {"type": "image", "source_type": "base64", "data": "BBBB", "mime_type": "image/gif"},
            {"type": "image", "url": "https://x/dog.png"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/webp", "data": "CCCC"}},
            {"type": "input_audio", "input_audio": {}}
        ]);
        let base64 = |media_type: &str, data: &str| {
            Part::Image(Image::Base64 {
                media_type: media_type.into(),
                data: data.into(),
            })
        };
        assert_eq!(
            parts(&content),
            vec![
                Part::Text("plain".into()),
                Part::Text("block".into()),
                Part::Image(Image::Url("https://x/cat.png".into())),
                base64("image/jpeg", "AAAA"),
                base64("image/gif", "BBBB"),
                Part::Image(Image::Url("https://x/dog.png".into())),
                base64("image/webp", "CCCC"),
                Part::Other(json!({"type": "input_audio", "input_audio": {}})),
            ]
        );
        assert_eq!(parts(&json!("")), vec![]);
        assert_eq!(parts(&Value::Null), vec![]);
    }
}
