"""The broker plugin's jar against the Kafka releases it must run on, without a broker: every
class, method and field of Kafka that the plugin's bytecode names exists in that release's jars
(with the same descriptor, declared or inherited). A reference to a member that only newer Kafka
has fails the class's verification or the call on an older broker (as
RetriableRemoteStorageException did on 3.9); newer members go through KafkaCompat's lookups.

javap (JDK 17) reads the constant pools of the plugin's classes and the members of Kafka's."""

from __future__ import annotations

import re
import shutil
import subprocess
import zipfile
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import stack
from tests.e2e.test_broker_plugin import plugin_jar

pytestmark = pytest.mark.integration

#: a constant-pool entry naming a member of a Kafka class:
#:   #7 = Methodref  #8.#9  // org/apache/kafka/x/Y.name:(descriptor)R
_MEMBER_REF = re.compile(
    r"=\s+(?:Methodref|InterfaceMethodref|Fieldref)\s+\S+\s+//\s+"
    r"(org/apache/kafka/[^.\s]+)\.(\"<init>\"|[^:\s]+):(\S+)$"
)
_CLASS_REF = re.compile(r"=\s+Class\s+\S+\s+//\s+(org/apache/kafka/\S+)$")
#: `javap -s -p` lines: a class header, a member's declaration, its descriptor
_HEADER = re.compile(r"^(?:public |protected |private |abstract |final |static |sealed )*"
                     r"(?:class|interface|enum) (\S+?)(?:<.*?>)?(?: extends (.+?))?"
                     r"(?: implements (.+?))?(?: permits .+?)? \{$")  # fmt: skip
_DESCRIPTOR = re.compile(r"^\s+descriptor: (\S+)$")


def _javap() -> str:
    javap = shutil.which("javap")
    assert javap is not None, (
        "javap (a JDK 17 or newer) is required: apt-get install openjdk-17-jdk"
    )
    return javap


def plugin_references(jar: Path) -> tuple[set[str], set[tuple[str, str, str]]]:
    """The Kafka classes and (class, member, descriptor) triples the plugin's bytecode names."""
    with zipfile.ZipFile(jar) as archive:
        classes = [
            name[: -len(".class")].replace("/", ".")
            for name in archive.namelist()
            if name.endswith(".class")
        ]
    out = subprocess.run(
        [_javap(), "-v", "-p", "-cp", str(jar), *classes],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    types, members = set(), set()
    for line in out.splitlines():
        if m := _MEMBER_REF.search(line):
            members.add((m.group(1), m.group(2).strip('"'), m.group(3)))
            types.add(m.group(1))
        elif m := _CLASS_REF.search(line):
            types.add(m.group(1))
    return types, members


class KafkaApi:
    """Members of Kafka's classes in one release's jars, as javap lists them."""

    def __init__(self, libs: Path) -> None:
        self.classpath = f"{libs}/*"
        self.members: dict[str, set[tuple[str, str]]] = {}
        self.parents: dict[str, list[str]] = {}
        self.missing: set[str] = set()

    def load(self, names: set[str]) -> None:
        todo = {n for n in names if n not in self.members and n not in self.missing}
        while todo:
            result = subprocess.run(
                [_javap(), "-s", "-p", "-cp", self.classpath, *(t.replace("/", ".") for t in todo)],
                capture_output=True,
                text=True,
                check=False,
                timeout=120,
            )
            found = self._parse(result.stdout)
            self.missing |= todo - found
            parents = {p for name in found for p in self.parents[name]}
            todo = {p for p in parents if p not in self.members and p not in self.missing}

    def _parse(self, text: str) -> set[str]:
        found: set[str] = set()
        current = ""
        declaration = ""
        for line in text.splitlines():
            if header := _HEADER.match(line):
                current = header.group(1).replace(".", "/")
                found.add(current)
                supers = ",".join(g for g in header.group(2, 3) if g)
                self.members[current] = set()
                self.parents[current] = [
                    re.sub(r"<.*", "", s.strip()).replace(".", "/")
                    for s in supers.split(",")
                    if s.strip() and "<" not in s.split(".")[0]
                ] or (["java/lang/Object"] if current != "java/lang/Object" else [])
            elif descriptor := _DESCRIPTOR.match(line):
                head = declaration.split("(")[0].split()
                name = head[-1].split(".")[-1] if head else ""
                if "(" in declaration and name == current.split("/")[-1]:
                    name = "<init>"
                self.members[current].add((name, descriptor.group(1)))
            elif line.strip():
                declaration = line.strip().rstrip(";")
        return found

    def has(self, owner: str, name: str, descriptor: str) -> bool:
        """Whether ``owner`` declares or inherits the member (constructors: declares)."""
        seen: set[str] = set()
        stack_ = [owner]
        while stack_:
            cls = stack_.pop()
            if cls in seen or cls not in self.members:
                continue
            seen.add(cls)
            if (name, descriptor) in self.members[cls]:
                return True
            if name != "<init>":
                stack_ += self.parents[cls]
        return False


@cache
def _plugin_refs() -> tuple[set[str], set[tuple[str, str, str]]]:
    return plugin_references(plugin_jar())


@pytest.mark.parametrize("version", [stack.KAFKA_39, stack.KAFKA_VERSION])
def test_every_kafka_member_the_plugin_names_exists(version: str) -> None:
    """On Kafka 3.9.1 and on the release the plugin is compiled against, each Kafka class the
    plugin names exists, and each method, constructor and field it calls resolves."""
    types, members = _plugin_refs()
    assert ("org/apache/kafka/server/log/remote/storage/LogSegmentData", "logSegment",
            "()Ljava/nio/file/Path;") in members  # fmt: skip
    api = KafkaApi(stack.kafka_libs(version))
    # the parents of Kafka classes may be JDK classes: javap finds those without a class path
    api.load(types | {owner for owner, _, _ in members})
    assert not (types & api.missing), f"Kafka {version} lacks {sorted(types & api.missing)}"
    unresolved = sorted(f"{o}.{n}{d}" for o, n, d in members if not api.has(o, n, d))
    assert not unresolved, f"Kafka {version} lacks {unresolved}"


def test_the_check_sees_a_member_only_newer_kafka_has() -> None:
    """The check itself: Kafka 3.9.1 has no RetriableRemoteStorageException and no
    RemoteLogSegmentMetadata.isTxnIdxEmpty(), 4.3.1 has both."""
    rlsm = "org/apache/kafka/server/log/remote/storage/RemoteLogSegmentMetadata"
    retriable = "org/apache/kafka/server/log/remote/storage/RetriableRemoteStorageException"
    old, new = KafkaApi(stack.kafka_libs(stack.KAFKA_39)), KafkaApi(stack.kafka_libs())
    for api in (old, new):
        api.load({rlsm, retriable})
    assert retriable in old.missing
    assert not old.has(rlsm, "isTxnIdxEmpty", "()Z")
    assert old.has(rlsm, "brokerId", "()I")  # inherited from RemoteLogMetadata
    assert retriable not in new.missing
    assert new.has(rlsm, "isTxnIdxEmpty", "()Z")
    assert new.has(retriable, "<init>", "(Ljava/lang/String;Ljava/lang/Throwable;)V")
