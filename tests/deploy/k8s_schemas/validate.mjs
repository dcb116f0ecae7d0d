// Strict offline validation of rendered Kubernetes manifests.
//
//   node validate.mjs --modules DIR RENDERED.json...
//
// Each RENDERED.json is a JSON array of objects (`kubectl kustomize`
// output, converted). Every object is checked against the OpenAPI schema
// of its apiVersion and kind: Kubernetes' own types and the
// prometheus-operator CRDs from the validators compiled from their OpenAPI
// documents (npm packages kubernetes-models and
// @kubernetes-models/prometheus-operator, installed under DIR by
// deploy/install_deps.sh), the JobSet from jobset-v1alpha2.schema.json
// beside this file. Types, formats, enumerations and required fields come
// from the schemas; on top of that every field a schema does not define is
// refused, as the API server's strict field validation (`kubectl apply
// --validate=strict`) does. A kind without a schema here is refused too.
//
// Unknown fields: the compiled validators read exactly the properties their
// schema defines, and enumerate the keys of free-form maps (labels,
// resource limits). Each object is validated through a proxy that records
// what was read; a key of an object that was never enumerated and never
// read is a field the schema does not have.
//
// Prints one line per object (`ok Kind/name` or `PROBLEM Kind/name: ...`)
// and exits 1 if any object fails, 2 on a usage error.

import fs from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

function usage(msg) {
  console.error(`validate.mjs: ${msg}\nusage: node validate.mjs --modules DIR RENDERED.json...`);
  process.exit(2);
}

const args = process.argv.slice(2);
if (args[0] !== "--modules" || args.length < 3) usage("--modules DIR and a file are required");
const modules = path.join(args[1], "node_modules");
if (!fs.existsSync(path.join(modules, "kubernetes-models"))) {
  usage(`no kubernetes-models under ${modules} (deploy/install_deps.sh installs it)`);
}
const files = args.slice(2);

async function load(relative) {
  return import(pathToFileURL(path.join(modules, relative)).href);
}

// ajv errors as lines: `/path: message (details)`, under `where`.
function describe(errors, where) {
  return errors.map((e) => {
    const at = `${where}${e.instancePath}` || "/";
    let detail = "";
    if (e.keyword === "additionalProperties") detail = ` "${e.params.additionalProperty}"`;
    if (e.keyword === "enum") detail = ` (${e.params.allowedValues.join(", ")})`;
    return `${at}: ${e.message}${detail}`;
  });
}

// A model class's validate(), run on `data` (found at `where`): the schema
// errors, or [].
function runModel(Model, data, where) {
  try {
    Model.prototype.validate.call(data);
    return [];
  } catch (e) {
    if (Array.isArray(e.errors)) return describe(e.errors, where);
    return [`${where || "/"}: ${e.message}`];
  }
}

// Wraps `value` (recursively) so that reads and enumerations of each object
// are recorded in `records` ({path, obj, read, enumerated}).
function tracked(value, where, records) {
  if (value === null || typeof value !== "object") return value;
  if (Array.isArray(value)) {
    return value.map((v, i) => tracked(v, `${where}/${i}`, records));
  }
  const record = { where, obj: value, read: new Set(), enumerated: false };
  records.push(record);
  const copy = {};
  for (const [k, v] of Object.entries(value)) copy[k] = tracked(v, `${where}/${k}`, records);
  return new Proxy(copy, {
    get(target, key, receiver) {
      if (typeof key === "string") record.read.add(key);
      return Reflect.get(target, key, receiver);
    },
    has(target, key) {
      if (typeof key === "string") record.read.add(key);
      return Reflect.has(target, key);
    },
    ownKeys(target) {
      record.enumerated = true;
      return Reflect.ownKeys(target);
    },
  });
}

// Validates `data` (found at `where`) with a model class: its schema
// errors plus one per field the schema does not define.
function checkStrict(Model, data, where) {
  const records = [];
  const problems = runModel(Model, tracked(data, where, records), where);
  for (const r of records) {
    if (r.enumerated) continue;
    for (const key of Object.keys(r.obj)) {
      if (!r.read.has(key)) problems.push(`${r.where}/${key}: unknown field "${key}"`);
    }
  }
  return problems;
}

// apiVersion + kind -> a function returning the object's problems.
async function checkerFor(apiVersion, kind) {
  if (apiVersion === "jobset.x-k8s.io/v1alpha2" && kind === "JobSet") return checkJobSet;
  const packages = {
    "monitoring.coreos.com": "@kubernetes-models/prometheus-operator",
  };
  const group = apiVersion.includes("/") ? apiVersion.split("/")[0] : "";
  const pkg = packages[group] || "kubernetes-models";
  const file = path.join(pkg, apiVersion, `${kind}.js`);
  if (!/^@?[A-Za-z0-9./-]+$/.test(file) || !fs.existsSync(path.join(modules, file))) return null;
  const Model = (await load(file))[kind];
  if (!Model) return null;
  return (doc) => checkStrict(Model, doc, "");
}

const schemaDir = path.dirname(fileURLToPath(import.meta.url));
const { default: Ajv2020 } = await load("ajv/dist/2020.js");
const jobsetSchema = JSON.parse(fs.readFileSync(path.join(schemaDir, "jobset-v1alpha2.schema.json")));
const validateJobSet = new Ajv2020({ allErrors: true, strict: true }).compile(jobsetSchema);
const { ObjectMeta } = await load("@kubernetes-models/apimachinery/apis/meta/v1/ObjectMeta.js");
const { JobTemplateSpec } = await load("kubernetes-models/batch/v1/JobTemplateSpec.js");

// The JobSet: its own schema (closed objects), then ObjectMeta and each
// replicated job's batch/v1 JobTemplateSpec through the Kubernetes schemas.
function checkJobSet(doc) {
  const problems = [];
  if (!validateJobSet(doc)) problems.push(...describe(validateJobSet.errors, ""));
  if (doc.metadata) problems.push(...checkStrict(ObjectMeta, doc.metadata, "/metadata"));
  (doc.spec?.replicatedJobs || []).forEach((rj, i) => {
    if (rj && typeof rj.template === "object") {
      problems.push(...checkStrict(JobTemplateSpec, rj.template, `/spec/replicatedJobs/${i}/template`));
    }
  });
  return problems;
}

// The proof that unknown fields are found everywhere, not only where a
// test happened to misspell one: a field injected into each object of a
// valid document, one position at a time, must be refused at exactly that
// position, except inside free-form maps, where it must be accepted.
const INJECTED = "asyncpsInjectedField";
function isMap(kind, where) {
  const last = where.split("/").pop();
  if (["labels", "annotations", "matchLabels", "limits", "requests", "data", "nodeSelector"].includes(last)) {
    return true;
  }
  return kind === "Service" && where === "/spec/selector";
}
function objectPositions(value, where, out) {
  if (value === null || typeof value !== "object") return out;
  if (!Array.isArray(value)) out.push(where);
  for (const [k, v] of Object.entries(value)) objectPositions(v, `${where}/${k}`, out);
  return out;
}
function injectionProblems(doc, check) {
  const problems = [];
  let refused = 0;
  let maps = 0;
  for (const where of objectPositions(doc, "", [])) {
    const copy = structuredClone(doc);
    let target = copy;
    for (const k of where.split("/").slice(1)) target = target[k];
    // In a map, a key beside the others with a value like theirs.
    target[INJECTED] = isMap(doc.kind, where) ? (Object.values(target)[0] ?? "x") : "x";
    const found = check(copy).filter((p) => p.includes(INJECTED));
    const here = found.some((p) => p.startsWith(`${where}/${INJECTED}:`) || p.startsWith(`${where || "/"}:`));
    if (isMap(doc.kind, where)) {
      maps++;
      if (found.length) problems.push(`${where}: a map's key refused as a field (${found[0]})`);
    } else if (here) {
      refused++;
    } else {
      problems.push(`${where}/${INJECTED}: an unknown field was accepted`);
    }
  }
  return { problems, refused, maps };
}

const selfTest = process.env.VALIDATE_INJECT === "1";
let failed = 0;
let checked = 0;
for (const file of files) {
  const docs = JSON.parse(fs.readFileSync(file, "utf8"));
  if (!Array.isArray(docs)) usage(`${file}: not a JSON array of objects`);
  for (const doc of docs) {
    const name = `${doc?.kind}/${doc?.metadata?.name}`;
    const check = await checkerFor(String(doc?.apiVersion), String(doc?.kind));
    let problems = check ? check(doc) : [`no schema for apiVersion ${doc?.apiVersion}, kind ${doc?.kind}`];
    let note = "";
    if (selfTest && check && problems.length === 0) {
      const r = injectionProblems(doc, check);
      problems = r.problems;
      note = ` (an injected field refused at all ${r.refused} object positions, accepted in ${r.maps} maps)`;
    }
    checked++;
    if (problems.length === 0) {
      console.log(`ok ${name}${note}`);
    } else {
      failed++;
      for (const p of problems) console.log(`PROBLEM ${name}: ${p}`);
    }
  }
}
console.log(`${checked - failed} of ${checked} objects valid against their schemas (strict)`);
process.exit(failed ? 1 : 0);
