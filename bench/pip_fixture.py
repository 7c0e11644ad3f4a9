#!/usr/bin/env python3
"""A static pip index and a project pinned against it, for the cache tests and bench.

pip_fixture.py REGISTRY_DIR PROJECT_DIR COUNT BYTES

Writes COUNT packages (h5i-fixture-000 ...), each a real wheel (h5i_fixture_NNN/__init__.py
with VALUE = NNN + 1, a payload of about BYTES bytes, and its dist-info with a RECORD) under
REGISTRY_DIR/files/, and a PEP 503 simple index over them under REGISTRY_DIR/simple/ (links
carry sha256 fragments). PROJECT_DIR gets requirements.txt: every package pinned with its
--hash. The index URL is not in the project: pip takes it from the host's configuration
(PIP_INDEX_URL, pip.conf), as `h5i box cache refresh pip` does. Deterministic; no network.
"""
import base64, hashlib, io, os, sys, zipfile

reg, proj, count, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
os.makedirs(os.path.join(reg, "files"), exist_ok=True)
os.makedirs(os.path.join(reg, "simple"), exist_ok=True)


def record_hash(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


reqs, names = [], []
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
with open(os.path.join(reg, "simple", "index.html"), "w") as f:
    f.write("<!DOCTYPE html><html><body>%s</body></html>\n"
            % "".join('<a href="%s/">%s</a>' % (n, n) for n in names))
with open(os.path.join(proj, "requirements.txt"), "w") as f:
    f.writelines(reqs)
