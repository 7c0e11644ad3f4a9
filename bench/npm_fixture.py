#!/usr/bin/env python3
"""A static npm registry and a project locked against it, for the cache tests and bench.

npm_fixture.py REGISTRY_DIR PROJECT_DIR COUNT BYTES BASE_URL

Writes COUNT packages (h5i-fixture-000 ...), each a real npm tarball (gzip tar, `package/`
prefix) with a payload of about BYTES bytes, laid out as a registry serves them
(NAME/-/NAME-VER.tgz), and PROJECT_DIR/package.json + package-lock.json (lockfile v3, resolved
URLs under BASE_URL, sha512 integrity). Deterministic; no network.
"""
import base64, hashlib, io, json, os, sys, tarfile

reg, proj, count, size, base = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
deps, pkgs = {}, {}
for i in range(count):
    name, ver = "h5i-fixture-%03d" % i, "1.0.%d" % i
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for fname, data in [
            ("package.json", json.dumps({"name": name, "version": ver, "main": "index.js"}).encode()),
            ("index.js", ("module.exports = %d;\n" % i).encode()),
            ("payload.txt", hashlib.sha256(name.encode()).hexdigest().encode() * (size // 64)),
        ]:
            info = tarfile.TarInfo("package/" + fname)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            t.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    os.makedirs(os.path.join(reg, name, "-"), exist_ok=True)
    with open(os.path.join(reg, name, "-", "%s-%s.tgz" % (name, ver)), "wb") as f:
        f.write(data)
    deps[name] = ver
    pkgs["node_modules/" + name] = {
        "version": ver,
        "resolved": "%s/%s/-/%s-%s.tgz" % (base, name, name, ver),
        "integrity": "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode(),
    }
root = {"name": "fixture-app", "version": "1.0.0", "dependencies": deps}
pkgs[""] = dict(root)
with open(os.path.join(proj, "package.json"), "w") as f:
    json.dump(root, f, indent=1)
with open(os.path.join(proj, "package-lock.json"), "w") as f:
    json.dump({"name": "fixture-app", "version": "1.0.0", "lockfileVersion": 3,
               "requires": True, "packages": pkgs}, f, indent=1)
