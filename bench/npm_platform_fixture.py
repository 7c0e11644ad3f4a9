#!/usr/bin/env python3
"""A static npm registry and a project whose lockfile holds platform-marker packages, for the
cache tests: the esbuild/@swc pattern.

npm_platform_fixture.py REGISTRY_DIR PROJECT_DIR BASE_URL

`h5i-native` 1.0.0 lists five optional dependencies, one per platform (`@h5i-native/linux-x64`,
`linux-arm64` for glibc, `linux-x64-musl` for musl, `darwin-arm64`, `win32-x64`), each with the
`os`, `cpu` and `libc` fields npm matches against the installing machine; its index.js loads the
one for the platform it runs on, and each exports its own name. The lockfile (v3) records every
platform's package, as `npm install` on any machine writes it; only the matching one is installed.
Deterministic; no network.
"""
import base64, hashlib, io, json, os, sys, tarfile

reg, proj, base = sys.argv[1], sys.argv[2], sys.argv[3]

PLATFORMS = {
    "linux-x64": {"os": ["linux"], "cpu": ["x64"], "libc": ["glibc"]},
    "linux-arm64": {"os": ["linux"], "cpu": ["arm64"], "libc": ["glibc"]},
    "linux-x64-musl": {"os": ["linux"], "cpu": ["x64"], "libc": ["musl"]},
    "darwin-arm64": {"os": ["darwin"], "cpu": ["arm64"]},
    "win32-x64": {"os": ["win32"], "cpu": ["x64"]},
}


def tarball(manifest, files):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for fname, data in [("package.json", json.dumps(manifest).encode())] + files:
            info = tarfile.TarInfo("package/" + fname)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def publish(name, ver, data):
    short = name.split("/")[-1]
    path = os.path.join(reg, name, "-", "%s-%s.tgz" % (short, ver))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return {
        "version": ver,
        "resolved": "%s/%s/-/%s-%s.tgz" % (base, name, short, ver),
        "integrity": "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode(),
    }


pkgs = {}
optional = {}
for plat, fields in PLATFORMS.items():
    name = "@h5i-native/" + plat
    manifest = dict({"name": name, "version": "1.0.0", "main": "index.js"}, **fields)
    entry = publish(name, "1.0.0", tarball(manifest, [("index.js", ("module.exports = %s;\n" % json.dumps(name)).encode())]))
    entry.update(fields)
    entry["optional"] = True
    pkgs["node_modules/" + name] = entry
    optional[name] = "1.0.0"
loader = b'const h = process.report.getReport().header;\n' \
    b'const libc = process.platform === "linux" && !h.glibcVersionRuntime ? "-musl" : "";\n' \
    b'module.exports = require("@h5i-native/" + process.platform + "-" + process.arch + libc);\n'
main = {"name": "h5i-native", "version": "1.0.0", "main": "index.js", "optionalDependencies": optional}
entry = publish("h5i-native", "1.0.0", tarball(main, [("index.js", loader)]))
entry["optionalDependencies"] = optional
pkgs["node_modules/h5i-native"] = entry

root = {"name": "fixture-app", "version": "1.0.0", "dependencies": {"h5i-native": "1.0.0"}}
pkgs[""] = dict(root)
with open(os.path.join(proj, "package.json"), "w") as f:
    json.dump(root, f, indent=1)
with open(os.path.join(proj, "package-lock.json"), "w") as f:
    json.dump({"name": "fixture-app", "version": "1.0.0", "lockfileVersion": 3,
               "requires": True, "packages": dict(sorted(pkgs.items()))}, f, indent=1)
