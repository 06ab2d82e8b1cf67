"""Every code block of README.md and docs/*.md, checked without running it: shell blocks
parse, their `rofu` commands are accepted by the real parsers and their curl calls name
real routes and request fields; Python compiles; JSON and TOML parse. Also: every setting
is documented with its default, links and repository paths resolve, and the README stays
a front door. tests/e2e/test_docs.py runs the runnable blocks against a real server."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from rofu.service.api.app import create_app
from rofu.service.settings import Settings
from tests.docs_blocks import (
    ROOT,
    Block,
    all_blocks,
    bash_syntax_error,
    blocks_of,
    doc_files,
    no_run_markers_without_block,
    rofu_parse_error,
    shell_commands,
)

BLOCKS = all_blocks()
#: ROFU_* names the docs may use that are not settings
#: environment variables that are not service settings: the config file, the tests' servers
#: and the client key `rofu replay --http` sends
NOT_SETTINGS = {"ROFU_CONFIG_FILE", "ROFU_TEST_DATABASE_URL", "ROFU_TEST_REDIS_URL", "ROFU_API_KEY"}
REPO_DIRS = ("rofu", "tests", "docs", "results", "benchmarks", "deploy", "docker", "scripts")
#: paths the docs name that are made by commands, not committed
MADE_PATHS = ("results/tmp/", "var/", "docker/secrets/")


def _of(lang: str) -> list[Block]:
    return [block for block in BLOCKS if block.lang == lang]


def _ids(blocks: list[Block]) -> list[str]:
    return [block.where for block in blocks]


def test_docs_have_blocks_of_every_kind_and_most_shell_and_python_blocks_run() -> None:
    runnable = [block for block in BLOCKS if block.runs]
    held_back = [block for block in BLOCKS if block.lang in ("bash", "python") and not block.runs]
    assert len(_of("bash")) >= 15
    assert len(_of("python")) >= 5
    assert len(runnable) >= 12
    assert len(held_back) <= len(runnable)  # a marker cannot quietly skip everything
    assert all(block.no_run for block in held_back)


@pytest.mark.parametrize("path", doc_files(), ids=lambda path: path.name)
def test_docs_every_no_run_marker_names_why_and_stands_before_a_block(path: Path) -> None:
    assert no_run_markers_without_block(path) == []


def test_docs_only_the_readme_opens_with_an_indented_block() -> None:
    indented = [block for block in BLOCKS if block.no_run == "an indented block: the two commands"]
    assert _ids(indented) == ["README.md:3"]
    readme = (ROOT / "README.md").read_text().splitlines()
    assert readme[2].startswith("    bash scripts/serve.sh    # set up (.venv, Python 3.11)")
    assert readme[3].startswith("    bash scripts/test.sh     # set up and run the whole test")


def test_docs_readme_is_a_front_door() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    assert "rofu.service" in text[: text.index("## Configuration")]  # architecture near the top


@pytest.mark.parametrize("block", _of("bash"), ids=_ids(_of("bash")))
def test_docs_shell_block_parses(block: Block) -> None:
    assert bash_syntax_error(block.text) is None, block.where


def _rofu_commands() -> list[tuple[str, list[str]]]:
    return [
        (block.where, words[1:])
        for block in _of("bash")
        for words in shell_commands(block.text)
        if words[0] == "rofu"
    ]


def test_docs_name_many_rofu_commands() -> None:
    named = {args[0] for _, args in _rofu_commands()}
    assert {"serve", "migrate", "trainer", "pin", "export", "evaluate", "replay", "bench"} <= named


@pytest.mark.parametrize(("where", "args"), _rofu_commands(), ids=lambda x: str(x))
def test_docs_rofu_command_is_accepted_by_its_parser(where: str, args: list[str]) -> None:
    assert rofu_parse_error(args) is None, f"{where}: rofu {' '.join(args)}"


def test_docs_rofu_check_refuses_unknown_commands_and_options() -> None:
    assert rofu_parse_error(["serve", "--colour", "red"]) is not None
    assert rofu_parse_error(["export", "--since", "2026-11-01"]) is not None  # no --format
    assert rofu_parse_error(["bench", "kernel", "--repeats", "x"]) is not None
    assert rofu_parse_error(["replay", "--protocol", "slow"]) is not None
    assert rofu_parse_error(["bench"]) is not None
    assert rofu_parse_error(["replay", "--protocol", "quick", "--workers", "2"]) is None


def test_docs_shell_helpers_split_commands_as_the_shell_does() -> None:
    script = (
        "FOO=1 rofu serve --port 9 &  # a comment\n"
        "curl -s a -d '{\n \"x\": 1}' | jq .p\n"
        'for a in b c; do\n  echo "#$a"\ndone\nrofu replay \\\n  --workers 2\n'
    )
    assert list(shell_commands(script)) == [
        ["rofu", "serve", "--port", "9"],
        ["curl", "-s", "a", "-d", '{\n "x": 1}'],
        ["jq", ".p"],
        ["for", "a", "in", "b", "c"],
        ["echo", "#$a"],
        ["done"],
        ["rofu", "replay", "--workers", "2"],
    ]
    assert bash_syntax_error("if true; then\n") is not None


@pytest.mark.parametrize("block", _of("python"), ids=_ids(_of("python")))
def test_docs_python_block_compiles(block: Block) -> None:
    compile(block.text, block.where, "exec")


@pytest.mark.parametrize("block", _of("json"), ids=_ids(_of("json")))
def test_docs_json_block_parses(block: Block) -> None:
    json.loads(block.text)


@pytest.mark.parametrize("block", _of("toml"), ids=_ids(_of("toml")))
def test_docs_toml_block_is_valid_settings(block: Block) -> None:
    Settings(**tomllib.loads(block.text))


def test_docs_block_reader_refuses_unknown_languages_and_open_fences(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="language"):
        blocks_of(tmp_path / "x.md", "```sh\nls\n```\n")
    with pytest.raises(ValueError, match="never closed"):
        blocks_of(tmp_path / "x.md", "```bash\nls\n")
    marked = blocks_of(tmp_path / "x.md", "<!-- doc-test: no-run (why) -->\n```bash\nls\n```\n")
    assert [(block.lang, block.no_run, block.runs) for block in marked] == [("bash", "why", False)]


# curl calls against the API's own schema


def _openapi() -> dict[str, Any]:
    schema: dict[str, Any] = create_app(Settings()).openapi()
    return schema


def _curl(words: list[str]) -> tuple[str, str, str | None]:
    """(method, path, body) of a curl command."""
    method, url, body = None, "", None
    rest = iter(words[1:])
    for word in rest:
        if word in ("-X", "--request"):
            method = next(rest)
        elif word in ("-d", "--data", "--data-raw"):
            body = next(rest)
        elif word in ("-H", "--header"):
            next(rest)
        elif not word.startswith("-"):
            url = word
    path = "/" + url.split("/", 1)[1].split("?")[0] if "/" in url else "/"
    return method or ("POST" if body is not None else "GET"), path, body


def _curl_calls() -> list[tuple[str, list[str]]]:
    return [
        (block.where, words)
        for block in _of("bash")
        for words in shell_commands(block.text)
        if words[0] == "curl"
    ]


def _operation(schema: dict[str, Any], method: str, path: str) -> dict[str, Any] | None:
    for template, operations in schema["paths"].items():
        if re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", template), path):
            found: dict[str, Any] | None = operations.get(method.lower())
            return found
    return None


def _body_fields(schema: dict[str, Any], operation: dict[str, Any]) -> set[str]:
    content = operation["requestBody"]["content"]["application/json"]["schema"]
    name = content["$ref"].rsplit("/", 1)[-1]
    return set(schema["components"]["schemas"][name]["properties"])


def test_docs_curl_calls_name_real_routes_and_fields() -> None:
    schema, calls = _openapi(), _curl_calls()
    assert len(calls) >= 12
    for where, words in calls:
        method, path, body = _curl(words)
        operation = _operation(schema, method, path)
        assert operation is not None, f"{where}: {method} {path} is not a route"
        if body is not None and "$" not in body:
            unknown = set(json.loads(body)) - _body_fields(schema, operation)
            assert not unknown, f"{where}: {method} {path} has no fields {unknown}"


def test_docs_curl_check_finds_a_wrong_route_and_field() -> None:
    schema = _openapi()
    assert _operation(schema, "POST", "/v1/selects") is None
    operation = _operation(schema, "POST", "/v1/select")
    assert operation is not None
    assert "contexts" not in _body_fields(schema, operation)
    assert _curl(["curl", "-s", "-X", "POST", "localhost:8000/v1/events/e-1/activate"]) == (
        "POST",
        "/v1/events/e-1/activate",
        None,
    )


# settings


def _documented_defaults() -> dict[str, str]:
    """`ROFU_X` -> the default cell of its row in docs/configuration.md's tables."""
    text = (ROOT / "docs/configuration.md").read_text()
    rows = re.findall(r"^\| `(ROFU_\w+)` \| ([^|]+) \|", text, re.M)
    return {name: default.strip() for name, default in rows}


def _matches(cell: str, value: object) -> bool:
    token = cell.replace("`", "").split(" ")[0]
    if value is None or value == []:
        return token in ("unset", "[]")
    if isinstance(value, bool):
        return token == str(value).lower()
    if isinstance(value, int | float):
        return re.fullmatch(r"-?[\d.e+-]+", token) is not None and float(token) == value
    if isinstance(value, tuple):  # a JSON list, which may hold spaces
        text = cell.replace("`", "")
        return text.startswith("[") and json.loads(text[: text.find("]") + 1]) == list(value)
    return token == str(value)


def test_docs_every_setting_is_documented_with_its_default() -> None:
    documented, defaults = _documented_defaults(), Settings().model_dump()
    assert set(documented) == {f"ROFU_{name.upper()}" for name in defaults}
    wrong = [
        f"ROFU_{name.upper()}: documented {documented[f'ROFU_{name.upper()}']!r}, is {value!r}"
        for name, value in defaults.items()
        if name != "arms" and not _matches(documented[f"ROFU_{name.upper()}"], value)
    ]
    assert wrong == []
    assert documented["ROFU_ARMS"] == "4 demo arms"
    assert len(Settings().arms) == 4


def test_docs_default_check_tells_a_wrong_default() -> None:
    assert _matches("`1e-3`", 0.001)
    assert _matches("262144 (256 KiB)", 262144)
    assert not _matches("5", 15.0)
    assert not _matches("`true`", False)
    assert _matches("`[100]`", (100,))
    assert _matches('`["mlp", "linear"]` (two)', ("mlp", "linear"))
    assert not _matches('`["mlp"]`', ("mlp", "linear"))
    assert not _matches("unset", 0)


def test_docs_name_only_real_settings() -> None:
    settings = {f"ROFU_{name.upper()}" for name in Settings.model_fields}
    named = {
        name
        for path in doc_files()
        for name in re.findall(r"\bROFU_[A-Z0-9_]*[A-Z0-9]\b", path.read_text())
    }
    assert named - settings - NOT_SETTINGS == set()


# links, paths and wording


def _slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_docs_links_resolve_to_files_and_headings() -> None:
    broken = []
    for path in doc_files():
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            file, _, anchor = target.partition("#")
            resolved = (path.parent / file).resolve() if file else path
            if not resolved.exists() or (anchor and anchor not in _anchors(resolved)):
                broken.append(f"{path.name}: {target}")
    assert broken == []


def test_docs_repository_paths_exist() -> None:
    missing = []
    for path in doc_files():
        for span in re.findall(r"`([^`\s]+)`", path.read_text()):
            if span.split("/")[0] not in REPO_DIRS or "/" not in span or "<" in span:
                continue
            if span.startswith(MADE_PATHS):
                continue
            if not list(ROOT.glob(span.rstrip("/"))):
                missing.append(f"{path.name}: {span}")
    assert missing == []


def test_docs_use_no_old_module_paths() -> None:
    old = re.compile(r"(?<![\w/.])(models|service|replay|benchmarks)[/.](?!md\b|RESULTS|results)\w")
    found = [
        f"{path.name}: {match.group(0)}"
        for path in doc_files()
        for match in old.finditer(path.read_text())
    ]
    assert found == []


def test_docs_say_nothing_of_how_the_project_is_worked_on() -> None:
    words = re.compile(r"\b(sessions?|issues?|tickets?|helpers?)\b", re.I)
    found = [
        f"{path.name}: {match.group(0)}"
        for path in doc_files()
        for match in words.finditer(path.read_text())
    ]
    assert found == []


# the README's API table: which calls need which key


def _readme_calls() -> list[tuple[str, str, str]]:
    """(method, path, key) of every call in the README's API table."""
    text = (ROOT / "README.md").read_text()
    calls = []
    rows = re.findall(r"^\| (`[A-Z/]+ /.+?) \| .+ \| (client|admin|none) \|$", text, re.M)
    for cell, key in rows:
        for call in re.findall(r"`([^`]+)`", cell):
            methods, _, path = call.partition(" ")
            assert set(methods.split("/")) <= {"GET", "POST", "PUT", "DELETE"}, call
            calls += [(method, path, key) for method in methods.split("/")]
    return calls


@pytest.mark.anyio
async def test_docs_readme_says_which_calls_need_an_admin_key(tmp_path: Path) -> None:
    from tests.support import app_client

    calls = _readme_calls()
    assert len(calls) >= 16
    settings = Settings(
        database_url=f"sqlite:///{tmp_path}/keys.sqlite",
        embedded_trainer=False,
        api_keys=["client-key-0123456789"],
        admin_api_keys=["admin-key-0123456789"],
    )
    async with app_client(settings) as (client, _):
        for method, template, key in calls:
            path = re.sub(r"\{[^}]+\}", "x-1", template)
            headers = {} if key == "none" else {"Authorization": "Bearer client-key-0123456789"}
            response = await client.request(method, path, headers=headers, json={})
            refused = response.status_code in (401, 403)
            assert refused is (key == "admin"), f"{method} {path}: {response.status_code}"
