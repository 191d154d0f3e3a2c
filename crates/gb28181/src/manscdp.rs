//! MANSCDP, the XML that GB28181 carries in MESSAGE bodies: the device's Keepalive notify,
//! its Catalog response (the channels behind it), and the Catalog query the server sends.
//!
//! Many devices declare `encoding="GB2312"` (and really send GBK); the body is decoded by its
//! declaration first, so a channel named in Chinese arrives intact.

use encoding_rs::Encoding;

/// Why a body could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ManscdpError {
    #[error("MANSCDP body declares encoding {0:?}, which is not known")]
    UnknownEncoding(String),
    #[error("MANSCDP body is not valid in its declared encoding {0}")]
    BadEncoding(&'static str),
    #[error("MANSCDP body is not well-formed XML: {0}")]
    Xml(String),
    #[error("MANSCDP body lacks <{0}>")]
    Missing(&'static str),
    #[error("MANSCDP <{0}> is not a number")]
    NotANumber(&'static str),
}

/// `<Notify><CmdType>Keepalive</CmdType>`: the device is alive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keepalive {
    pub sn: u32,
    pub device_id: String,
    /// `OK` when the device reports itself healthy.
    pub status_ok: bool,
}

/// One `<Item>` of a Catalog response's `<DeviceList>`: usually a camera channel.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CatalogItem {
    pub device_id: String,
    pub name: String,
    pub manufacturer: Option<String>,
    pub model: Option<String>,
    pub parent_id: Option<String>,
    pub civil_code: Option<String>,
    pub address: Option<String>,
    /// `<Status>ON</Status>` (some devices say `OK`, or `ONLINE`).
    pub online: bool,
}

/// `<Response><CmdType>Catalog</CmdType>`: one part of the device's catalog. Devices split a
/// long catalog over several MESSAGEs with the same SN; `sum_num` is the total of items.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogResponse {
    pub sn: u32,
    pub device_id: String,
    pub sum_num: usize,
    pub items: Vec<CatalogItem>,
}

/// A MANSCDP body as far as the registrar needs to tell them apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Manscdp {
    Keepalive(Keepalive),
    Catalog(CatalogResponse),
    /// Anything else (alarms, device info, ...): its root element and CmdType, so the
    /// caller can log it and still answer 200.
    Other {
        root: String,
        cmd_type: String,
        device_id: Option<String>,
    },
}

/// Decodes a body by its XML declaration's encoding (UTF-8 when none is declared).
pub fn decode(body: &[u8]) -> Result<String, ManscdpError> {
    let encoding = match declared_encoding(body) {
        None => encoding_rs::UTF_8,
        Some(label) => Encoding::for_label(label.as_bytes())
            .ok_or_else(|| ManscdpError::UnknownEncoding(label.clone()))?,
    };
    // GB2312 maps to GBK here (the WHATWG label table), which is what devices really send.
    let (text, had_errors) = encoding.decode_without_bom_handling(body);
    if had_errors {
        return Err(ManscdpError::BadEncoding(encoding.name()));
    }
    Ok(text.into_owned())
}

/// The `encoding="..."` of a leading `<?xml ...?>`, read from the bytes: the declaration is
/// ASCII in every encoding a device uses.
fn declared_encoding(body: &[u8]) -> Option<String> {
    let start = body.iter().position(|b| !b.is_ascii_whitespace())?;
    let body = &body[start..];
    if !body.starts_with(b"<?xml") {
        return None;
    }
    let end = body.windows(2).position(|w| w == b"?>")?;
    let declaration = std::str::from_utf8(&body[..end]).ok()?;
    let after = &declaration[declaration.find("encoding")? + "encoding".len()..];
    let after = after.trim_start().strip_prefix('=')?.trim_start();
    let quote = after.chars().next().filter(|c| *c == '"' || *c == '\'')?;
    let value = &after[1..];
    Some(value[..value.find(quote)?].to_string())
}

/// Parses a MESSAGE body.
pub fn parse(body: &[u8]) -> Result<Manscdp, ManscdpError> {
    let text = decode(body)?;
    let document = roxmltree::Document::parse(&text).map_err(|e| ManscdpError::Xml(e.to_string()))?;
    let root = document.root_element();
    let cmd_type = child_text(root, "CmdType").ok_or(ManscdpError::Missing("CmdType"))?;
    match (root.tag_name().name(), cmd_type.as_str()) {
        ("Notify", "Keepalive") => Ok(Manscdp::Keepalive(Keepalive {
            sn: number(root, "SN")?,
            device_id: child_text(root, "DeviceID").ok_or(ManscdpError::Missing("DeviceID"))?,
            status_ok: child_text(root, "Status").is_some_and(|s| s.eq_ignore_ascii_case("OK")),
        })),
        ("Response", "Catalog") => parse_catalog(root).map(Manscdp::Catalog),
        (name, _) => Ok(Manscdp::Other {
            root: name.to_string(),
            cmd_type,
            device_id: child_text(root, "DeviceID"),
        }),
    }
}

fn parse_catalog(root: roxmltree::Node<'_, '_>) -> Result<CatalogResponse, ManscdpError> {
    let items = root
        .children()
        .find(|n| n.has_tag_name("DeviceList"))
        .map(|list| {
            list.children()
                .filter(|n| n.has_tag_name("Item"))
                .map(parse_item)
                .collect()
        })
        .unwrap_or_default();
    Ok(CatalogResponse {
        sn: number(root, "SN")?,
        device_id: child_text(root, "DeviceID").ok_or(ManscdpError::Missing("DeviceID"))?,
        sum_num: number(root, "SumNum")? as usize,
        items,
    })
}

fn parse_item(item: roxmltree::Node<'_, '_>) -> CatalogItem {
    let status = child_text(item, "Status")
        .unwrap_or_default()
        .to_ascii_uppercase();
    CatalogItem {
        device_id: child_text(item, "DeviceID").unwrap_or_default(),
        name: child_text(item, "Name").unwrap_or_default(),
        manufacturer: child_text(item, "Manufacturer"),
        model: child_text(item, "Model"),
        parent_id: child_text(item, "ParentID"),
        civil_code: child_text(item, "CivilCode"),
        address: child_text(item, "Address"),
        online: matches!(status.as_str(), "ON" | "OK" | "ONLINE"),
    }
}

fn child_text(node: roxmltree::Node<'_, '_>, name: &str) -> Option<String> {
    let child = node.children().find(|n| n.has_tag_name(name))?;
    Some(child.text().unwrap_or_default().trim().to_string())
}

fn number(node: roxmltree::Node<'_, '_>, name: &'static str) -> Result<u32, ManscdpError> {
    child_text(node, name)
        .ok_or(ManscdpError::Missing(name))?
        .parse()
        .map_err(|_| ManscdpError::NotANumber(name))
}

/// The Catalog query the server sends to a device after it registers. Declared GB2312, as
/// the standard's examples are: some devices refuse anything else, and the content is ASCII.
pub fn catalog_query(sn: u32, device_id: &str) -> Vec<u8> {
    format!(
        "<?xml version=\"1.0\" encoding=\"GB2312\"?>\r\n<Query>\r\n<CmdType>Catalog</CmdType>\r\n\
         <SN>{sn}</SN>\r\n<DeviceID>{}</DeviceID>\r\n</Query>\r\n",
        escape(device_id)
    )
    .into_bytes()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEEPALIVE: &str = "<?xml version=\"1.0\" encoding=\"GB2312\"?>\r\n<Notify>\r\n\
        <CmdType>Keepalive</CmdType>\r\n<SN>43</SN>\r\n<DeviceID>34020000001320000001</DeviceID>\r\n\
        <Status>OK</Status>\r\n</Notify>\r\n";

    fn catalog_gbk() -> Vec<u8> {
        let xml = "<?xml version=\"1.0\" encoding=\"GB2312\"?>\n<Response>\n<CmdType>Catalog</CmdType>\n\
            <SN>17430</SN>\n<DeviceID>34020000001320000001</DeviceID>\n<SumNum>2</SumNum>\n\
            <DeviceList Num=\"2\">\n<Item>\n<DeviceID>34020000001310000001</DeviceID>\n\
            <Name>大门摄像头</Name>\n<Manufacturer>Hikvision</Manufacturer>\n<Model>IP Camera</Model>\n\
            <Owner>Owner</Owner>\n<CivilCode>3402000000</CivilCode>\n<Address>Address</Address>\n\
            <Parental>0</Parental>\n<ParentID>34020000001320000001</ParentID>\n<SafetyWay>0</SafetyWay>\n\
            <RegisterWay>1</RegisterWay>\n<Secrecy>0</Secrecy>\n<Status>ON</Status>\n</Item>\n\
            <Item>\n<DeviceID>34020000001310000002</DeviceID>\n<Name>Camera 02</Name>\n\
            <Status>OFF</Status>\n</Item>\n</DeviceList>\n</Response>\n";
        encoding_rs::GBK.encode(xml).0.into_owned()
    }

    #[test]
    fn keepalive() {
        let parsed = parse(KEEPALIVE.as_bytes()).unwrap();
        assert_eq!(
            parsed,
            Manscdp::Keepalive(Keepalive {
                sn: 43,
                device_id: "34020000001320000001".into(),
                status_ok: true
            })
        );
    }

    #[test]
    fn catalog_in_gbk() {
        let Manscdp::Catalog(catalog) = parse(&catalog_gbk()).unwrap() else {
            panic!("not a catalog");
        };
        assert_eq!(catalog.sn, 17430);
        assert_eq!(catalog.sum_num, 2);
        assert_eq!(catalog.items.len(), 2);
        let first = &catalog.items[0];
        assert_eq!(first.device_id, "34020000001310000001");
        assert_eq!(first.name, "大门摄像头");
        assert_eq!(first.manufacturer.as_deref(), Some("Hikvision"));
        assert_eq!(first.parent_id.as_deref(), Some("34020000001320000001"));
        assert!(first.online);
        assert!(!catalog.items[1].online);
        assert_eq!(catalog.items[1].model, None);
    }

    #[test]
    fn utf8_without_declaration_and_other_commands() {
        let body = "<Notify><CmdType>Alarm</CmdType><SN>1</SN><DeviceID>x</DeviceID></Notify>";
        assert_eq!(
            parse(body.as_bytes()).unwrap(),
            Manscdp::Other {
                root: "Notify".into(),
                cmd_type: "Alarm".into(),
                device_id: Some("x".into())
            }
        );
    }

    #[test]
    fn bad_bodies() {
        let unknown = "<?xml version='1.0' encoding='klingon'?><Notify/>";
        assert_eq!(
            parse(unknown.as_bytes()),
            Err(ManscdpError::UnknownEncoding("klingon".into()))
        );
        assert!(matches!(parse(b"<Notify><CmdType>"), Err(ManscdpError::Xml(_))));
        assert_eq!(parse(b"<Notify/>"), Err(ManscdpError::Missing("CmdType")));
        let bad_sn = "<Notify><CmdType>Keepalive</CmdType><SN>x</SN><DeviceID>1</DeviceID></Notify>";
        assert_eq!(parse(bad_sn.as_bytes()), Err(ManscdpError::NotANumber("SN")));
        assert_eq!(
            parse(&[0xff, 0xfe, 0x00]),
            Err(ManscdpError::BadEncoding("UTF-8"))
        );
    }

    #[test]
    fn catalog_query_is_well_formed() {
        let body = catalog_query(7, "34020000001320000001");
        let text = decode(&body).unwrap();
        let document = roxmltree::Document::parse(&text).unwrap();
        let root = document.root_element();
        assert_eq!(root.tag_name().name(), "Query");
        assert_eq!(child_text(root, "CmdType").as_deref(), Some("Catalog"));
        assert_eq!(child_text(root, "SN").as_deref(), Some("7"));
        assert_eq!(
            child_text(root, "DeviceID").as_deref(),
            Some("34020000001320000001")
        );
    }
}
