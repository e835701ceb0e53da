"""Validation against the vendored schemas in tests/schemas/ with the standard library alone (the lock has no lxml,
xmlschema or jsonschema; see tests/schemas/README.md).

xsd_problems(xml_text, xsd_path): every way an XML document breaks an XML Schema, for the part of XML Schema that
junit-10.xsd uses: global <xs:element>s (referenced by `ref`, typed by `type="xs:string"`, a named complexType or
an inline one), <xs:sequence> and <xs:choice> with minOccurs/maxOccurs, `mixed` content, <xs:attribute> with
`use="required"` and a type that is xs:string or a named <xs:simpleType> restricted by <xs:pattern>. A content
model becomes a regular expression over the children's names, so order and counts are checked as the schema says;
an attribute the schema does not declare is a problem (junit-10.xsd has no anyAttribute). A construct outside this
subset raises Unsupported: it is never skipped.

json_schema_problems(data, schema): every way a JSON value breaks a JSON Schema, for the keywords type, enum,
properties, required, additionalProperties (true/false), items, anyOf, minimum and local $ref; any other keyword
raises Unsupported.
"""

from __future__ import annotations

import re
from pathlib import Path
from xml.etree import ElementTree

XS = "{http://www.w3.org/2001/XMLSchema}"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
JUNIT_XSD = SCHEMAS / "junit-10.xsd"
GRADESCOPE_SCHEMA = SCHEMAS / "gradescope-results.schema.json"


class Unsupported(ValueError):
    """A schema construct this checker does not implement."""


# --- XML Schema (the subset junit-10.xsd uses) ----------------------------------------------------------


class _Xsd:
    def __init__(self, path: Path):
        root = ElementTree.parse(path).getroot()
        self.elements, self.complex_types, self.simple_types = {}, {}, {}
        for node in root:
            if not isinstance(node.tag, str):
                continue  # a comment
            name = node.get("name")
            if node.tag == f"{XS}element":
                self.elements[name] = node
            elif node.tag == f"{XS}complexType":
                self.complex_types[name] = node
            elif node.tag == f"{XS}simpleType":
                self.simple_types[name] = self._pattern(node)
            else:
                raise Unsupported(f"{path}: top-level {node.tag}")

    @staticmethod
    def _pattern(node) -> re.Pattern:
        restriction = node.find(f"{XS}restriction")
        patterns = [] if restriction is None else restriction.findall(f"{XS}pattern")
        if restriction is None or restriction.get("base") != "xs:string" or len(patterns) != 1 or \
                len(list(restriction)) != 1:
            raise Unsupported(f"simpleType {node.get('name')}: only a string restricted by one pattern")
        return re.compile(patterns[0].get("value"))  # XSD patterns match the whole value: fullmatch below

    def complex_type_of(self, element) -> tuple[str, object]:
        """('string', None) or ('complex', the complexType node)."""
        typ = element.get("type")
        inline = element.find(f"{XS}complexType")
        if typ == "xs:string" and inline is None:
            return "string", None
        if typ in self.complex_types and inline is None:
            return "complex", self.complex_types[typ]
        if typ is None and inline is not None:
            return "complex", inline
        raise Unsupported(f"element {element.get('name')}: type {typ!r}")

    def _occurs(self, node) -> str:
        low = int(node.get("minOccurs", "1"))
        high = node.get("maxOccurs", "1")
        return f"{{{low},{'' if high == 'unbounded' else int(high)}}}"

    def model(self, node) -> str:
        """A regular expression over '<name>' tokens for a particle (element ref, sequence or choice)."""
        if node.tag == f"{XS}element":
            if node.get("ref") is None:
                raise Unsupported("a local element declaration (only ref= is used here)")
            return f"(?:<{re.escape(node.get('ref'))}>){self._occurs(node)}"
        parts = [self.model(child) for child in node if isinstance(child.tag, str)]
        if node.tag == f"{XS}sequence":
            return f"(?:{''.join(parts)}){self._occurs(node)}"
        if node.tag == f"{XS}choice":
            return f"(?:{'|'.join(parts)}){self._occurs(node)}"
        raise Unsupported(f"particle {node.tag}")


def xsd_problems(xml_text: str, xsd_path: Path = JUNIT_XSD) -> list[str]:
    """Every way `xml_text` breaks the schema at `xsd_path` ([] when it is valid)."""
    schema = _Xsd(xsd_path)
    root = ElementTree.fromstring(xml_text)
    problems: list[str] = []
    if root.tag not in schema.elements:
        return [f"root <{root.tag}> is not a global element of the schema"]
    _check(schema, root, f"/{root.tag}", problems)
    return problems


def _check(schema: _Xsd, node, where: str, problems: list[str]) -> None:
    declaration = schema.elements.get(node.tag)
    if declaration is None:
        problems.append(f"{where}: <{node.tag}> is not declared")
        return
    kind, complex_type = schema.complex_type_of(declaration)
    children = [child for child in node if isinstance(child.tag, str)]
    if kind == "string":
        if node.attrib:
            problems.append(f"{where}: attributes {sorted(node.attrib)} on a simple string element")
        if children:
            problems.append(f"{where}: child elements {[c.tag for c in children]} in a string element")
        return
    attributes = {a.get("name"): a for a in complex_type.findall(f"{XS}attribute")}
    for name, value in node.attrib.items():
        if name not in attributes:
            problems.append(f"{where}: attribute {name!r} is not allowed (allowed: {', '.join(sorted(attributes))})")
            continue
        typ = attributes[name].get("type")
        if typ in schema.simple_types and not schema.simple_types[typ].fullmatch(value):
            problems.append(f"{where}: attribute {name}={value!r} does not match the pattern of {typ}")
        elif typ not in schema.simple_types and typ != "xs:string":
            raise Unsupported(f"attribute type {typ!r}")
    for name, attribute in attributes.items():
        if attribute.get("use") == "required" and name not in node.attrib:
            problems.append(f"{where}: required attribute {name!r} is missing")
    particles = [c for c in complex_type if isinstance(c.tag, str) and c.tag != f"{XS}attribute"]
    if len(particles) > 1:
        raise Unsupported(f"complexType with {len(particles)} content particles")
    pattern = schema.model(particles[0]) if particles else ""
    tokens = "".join(f"<{child.tag}>" for child in children)
    if not re.fullmatch(pattern, tokens):
        problems.append(f"{where}: children {[c.tag for c in children]} do not fit the content model of "
                        f"<{node.tag}>")
    if complex_type.get("mixed") != "true":
        texts = [node.text] + [child.tail for child in children]
        if any(text and text.strip() for text in texts):
            problems.append(f"{where}: text inside <{node.tag}>, whose content is elements only")
    for index, child in enumerate(children, start=1):
        _check(schema, child, f"{where}/{child.tag}[{index}]", problems)


# --- JSON Schema (the keywords the Gradescope schema uses) -----------------------------------------------

JSON_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
KNOWN = {"$schema", "$id", "title", "description", "$defs", "type", "enum", "properties", "required",
         "additionalProperties", "items", "anyOf", "minimum", "$ref"}


def _is_type(value, name: str) -> bool:
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, JSON_TYPES[name])


def json_schema_problems(data, schema: dict, root: dict = None, where: str = "$") -> list[str]:
    """Every way `data` breaks `schema` ([] when it is valid)."""
    root = schema if root is None else root
    unknown = set(schema) - KNOWN
    if unknown:
        raise Unsupported(f"JSON Schema keywords {sorted(unknown)}")
    if "$ref" in schema:
        if not schema["$ref"].startswith("#/$defs/"):
            raise Unsupported(f"$ref {schema['$ref']}")
        return json_schema_problems(data, root["$defs"][schema["$ref"][len("#/$defs/"):]], root, where)
    problems = []
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is_type(data, name) for name in names):
            return [f"{where}: expected {' or '.join(names)}, actual {type(data).__name__} {data!r:.60}"]
    if "enum" in schema and data not in schema["enum"]:
        problems.append(f"{where}: {data!r} is not one of {schema['enum']}")
    if "minimum" in schema and _is_type(data, "number") and data < schema["minimum"]:
        problems.append(f"{where}: {data} is below the minimum {schema['minimum']}")
    if isinstance(data, dict):
        for name in schema.get("required", []):
            if name not in data:
                problems.append(f"{where}: required field {name!r} is missing")
        properties = schema.get("properties", {})
        for name, value in data.items():
            if name in properties:
                problems += json_schema_problems(value, properties[name], root, f"{where}.{name}")
            elif schema.get("additionalProperties", True) is False:
                problems.append(f"{where}: field {name!r} is not in the specification")
    if isinstance(data, list) and "items" in schema:
        for index, value in enumerate(data):
            problems += json_schema_problems(value, schema["items"], root, f"{where}[{index}]")
    if "anyOf" in schema:
        branches = [json_schema_problems(data, branch, root, where) for branch in schema["anyOf"]]
        if all(branches):
            problems.append(f"{where}: fits none of anyOf: " + " | ".join("; ".join(b) for b in branches))
    return problems
