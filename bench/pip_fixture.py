#!/usr/bin/env python3
"""A static pip index and a project pinned against it, for the cache tests and bench.

pip_fixture.py REGISTRY_DIR PROJECT_DIR COUNT BYTES [requirements | uv BASE | poetry BASE]

Writes COUNT packages (h5i-fixture-000 ...), each a real wheel (h5i_fixture_NNN/__init__.py
with VALUE = NNN + 1, a payload of about BYTES bytes, and its dist-info with a RECORD) under
REGISTRY_DIR/files/, and a PEP 503 simple index over them under REGISTRY_DIR/simple/ (links
carry sha256 fragments). PROJECT_DIR gets requirements.txt: every package pinned with its
--hash. The index URL is not in the project: pip takes it from the host's configuration
(PIP_INDEX_URL, pip.conf), as `h5i box cache refresh pip` does.

With `uv BASE` the project is a uv project instead: pyproject.toml (its index BASE/simple) and the
uv.lock uv writes for it (wheel URLs under BASE/files/, sha256 hashes). With `poetry BASE`, a
Poetry project: pyproject.toml (a source BASE/simple) and the poetry.lock Poetry 1.3 writes for
it (lock-version 2.0, its content-hash). Deterministic; no network.
"""
import base64, hashlib, io, json, os, sys, zipfile

reg, proj, count, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
kind = sys.argv[5] if len(sys.argv) > 5 else "requirements"
base = sys.argv[6] if len(sys.argv) > 6 else ""
os.makedirs(os.path.join(reg, "files"), exist_ok=True)
os.makedirs(os.path.join(reg, "simple"), exist_ok=True)


def record_hash(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


reqs, names, locked = [], [], []
for i in range(count):
    name, mod, ver = "h5i-fixture-%03d" % i, "h5i_fixture_%03d" % i, "1.0.%d" % i
    wheel = "%s-%s-py3-none-any.whl" % (mod, ver)
    info = "%s-%s.dist-info" % (mod, ver)
    files = [
        ("%s/__init__.py" % mod, ("VALUE = %d\n" % (i + 1)).encode()),
        ("%s/payload.txt" % mod, hashlib.sha256(name.encode()).hexdigest().encode() * (size // 64)),
        ("%s/METADATA" % info, ("Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (name, ver)).encode()),
        ("%s/WHEEL" % info, b"Wheel-Version: 1.0\nGenerator: h5i-fixture\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
    ]
    record = "".join("%s,%s,%d\n" % (n, record_hash(d), len(d)) for n, d in files) + "%s/RECORD,,\n" % info
    files.append(("%s/RECORD" % info, record.encode()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files:
            zi = zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            z.writestr(zi, d)
    data = buf.getvalue()
    with open(os.path.join(reg, "files", wheel), "wb") as f:
        f.write(data)
    digest = hashlib.sha256(data).hexdigest()
    os.makedirs(os.path.join(reg, "simple", name), exist_ok=True)
    with open(os.path.join(reg, "simple", name, "index.html"), "w") as f:
        f.write('<!DOCTYPE html><html><body><a href="../../files/%s#sha256=%s">%s</a></body></html>\n'
                % (wheel, digest, wheel))
    reqs.append("%s==%s --hash=sha256:%s\n" % (name, ver, digest))
    names.append(name)
    locked.append((name, ver, wheel, digest))
with open(os.path.join(reg, "simple", "index.html"), "w") as f:
    f.write("<!DOCTYPE html><html><body>%s</body></html>\n"
            % "".join('<a href="%s/">%s</a>' % (n, n) for n in names))


def write(name, text):
    with open(os.path.join(proj, name), "w") as f:
        f.write(text)


if kind == "requirements":
    write("requirements.txt", "".join(reqs))
elif kind == "uv":
    deps = "".join('"%s==%s", ' % (n, v) for n, v, _, _ in locked)
    write("pyproject.toml", '[project]\nname = "fixture-app"\nversion = "0.1.0"\nrequires-python = ">=3.11"\n'
          'dependencies = [%s]\n\n[[tool.uv.index]]\nurl = "%s/simple"\ndefault = true\n' % (deps.rstrip(", "), base))
    lock = ['version = 1\nrevision = 5\nrequires-python = ">=3.11"\n\n[[package]]\nname = "fixture-app"\n'
            'version = "0.1.0"\nsource = { virtual = "." }\ndependencies = [\n']
    lock += ['    { name = "%s" },\n' % n for n, _, _, _ in locked]
    lock.append(']\n\n[package.metadata]\nrequires-dist = [\n')
    lock += ['    { name = "%s", specifier = "==%s" },\n' % (n, v) for n, v, _, _ in locked]
    lock.append("]\n")
    for n, v, w, d in locked:
        lock.append('\n[[package]]\nname = "%s"\nversion = "%s"\nsource = { registry = "%s/simple" }\n'
                    'wheels = [\n    { url = "%s/files/%s", hash = "sha256:%s" },\n]\n' % (n, v, base, base, w, d))
    write("uv.lock", "".join(lock))
elif kind == "poetry":
    deps = {"python": "^3.11"}
    deps.update({n: v for n, v, _, _ in locked})
    source = [{"name": "fixture", "url": base + "/simple", "default": True}]
    write("pyproject.toml", '[tool.poetry]\nname = "fixture-app"\nversion = "0.1.0"\ndescription = ""\nauthors = []\n\n'
          '[tool.poetry.dependencies]\n%s\n[[tool.poetry.source]]\nname = "fixture"\nurl = "%s/simple"\ndefault = true\n'
          % ("".join('%s = "%s"\n' % kv for kv in deps.items()), base))
    # Poetry 1.3's content-hash: sha256 of the relevant [tool.poetry] keys as sorted JSON.
    relevant = {"dependencies": deps, "source": source, "extras": None, "dev-dependencies": None}
    content_hash = hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()
    lock = ["# This file is automatically @generated by Poetry and should not be changed by hand.\n"]
    for n, v, w, d in locked:
        lock.append('\n[[package]]\nname = "%s"\nversion = "%s"\ndescription = ""\ncategory = "main"\n'
                    'optional = false\npython-versions = "*"\nfiles = [\n    {file = "%s", hash = "sha256:%s"},\n]\n\n'
                    '[package.source]\ntype = "legacy"\nurl = "%s/simple"\nreference = "fixture"\n' % (n, v, w, d, base))
    lock.append('\n[metadata]\nlock-version = "2.0"\npython-versions = "^3.11"\ncontent-hash = "%s"\n' % content_hash)
    write("poetry.lock", "".join(lock))
else:
    sys.exit("pip_fixture.py: unknown project kind %r (requirements, uv, poetry)" % kind)
