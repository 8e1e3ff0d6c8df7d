// Run Python code on the real MicroPython interpreter (the official WebAssembly port) under Node.
//
//   node firmware/mptest/run_micropython.mjs [--package DIR]... [--import MOD[,MOD...]] [--tests FILE.py]
//
// --package DIR   copy DIR's .py files (recursively) into MicroPython's /lib/<basename of DIR>
// --import MODS   import each module, printing "IMPORTED <mod>"
// --tests FILE    load FILE as a module and call each of its test_* functions (sorted by name),
//                 printing "PASS <name>" or "FAIL <name>" plus the traceback, then
//                 "MPSUMMARY passed=<n> failed=<m>"
//
// Prints "IMPLEMENTATION <name> <version>" first. Exits 1 if an import or a test failed.
// The interpreter is @micropython/micropython-webassembly-pyscript (firmware/package.json, `npm ci`).

import fs from "node:fs";
import path from "node:path";
import { loadMicroPython } from "@micropython/micropython-webassembly-pyscript";

function parseArgs(argv) {
  const args = { packages: [], imports: [], tests: null };
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i];
    const value = argv[i + 1];
    if (value === undefined) throw new Error(`${flag} needs a value`);
    if (flag === "--package") args.packages.push(value);
    else if (flag === "--import") args.imports.push(...value.split(",").filter(Boolean));
    else if (flag === "--tests") args.tests = value;
    else throw new Error(`unknown argument ${flag}`);
    i++;
  }
  return args;
}

function copyTree(FS, source, target) {
  FS.mkdirTree(target);
  for (const entry of fs.readdirSync(source, { withFileTypes: true })) {
    const from = path.join(source, entry.name);
    const to = `${target}/${entry.name}`;
    if (entry.isDirectory()) {
      if (entry.name !== "__pycache__") copyTree(FS, from, to);
    } else if (entry.name.endsWith(".py")) {
      FS.writeFile(to, fs.readFileSync(from));
    }
  }
}

const DRIVER = `
import sys

def _run(imports, tests):
    print("IMPLEMENTATION", sys.implementation.name, ".".join(str(p) for p in sys.implementation.version[:3]))
    ok = True
    for name in imports:
        try:
            __import__(name)
            print("IMPORTED", name)
        except Exception as err:
            ok = False
            print("IMPORT-FAILED", name)
            sys.print_exception(err)
    if tests:
        module = __import__(tests)
        names = sorted(n for n in dir(module) if n.startswith("test_") and callable(getattr(module, n)))
        passed = failed = 0
        for name in names:
            try:
                getattr(module, name)()
            except Exception as err:
                failed += 1
                ok = False
                print("FAIL", name)
                sys.print_exception(err)
            else:
                passed += 1
                print("PASS", name)
        print("MPSUMMARY passed=%d failed=%d" % (passed, failed))
    return ok
`;

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const mp = await loadMicroPython({
    heapsize: 16 * 1024 * 1024,
    stdout: (text) => process.stdout.write(text),
    stderr: (text) => process.stderr.write(text),
    linebuffer: false,
  });
  for (const dir of args.packages) copyTree(mp.FS, path.resolve(dir), `/lib/${path.basename(path.resolve(dir))}`);
  let testModule = "";
  if (args.tests) {
    testModule = path.basename(args.tests, ".py");
    mp.FS.mkdirTree("/lib");
    mp.FS.writeFile(`/lib/${testModule}.py`, fs.readFileSync(args.tests));
  }
  mp.runPython(DRIVER);
  mp.runPython(`_ok = _run(${JSON.stringify(args.imports)}, ${JSON.stringify(testModule)})`);
  process.exitCode = mp.globals.get("_ok") === true ? 0 : 1;
}

main().catch((err) => {
  console.error(err && err.message ? err.message : err);
  process.exitCode = 1;
});
