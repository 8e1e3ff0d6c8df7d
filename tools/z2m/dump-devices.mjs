#!/usr/bin/env node
// Prints a zigbee2mqtt `bridge/devices` message (JSON) for the device models named on the command line, built from
// the real definitions in the pinned zigbee-herdsman-converters package, the way zigbee2mqtt builds it
// (lib/extension/bridge.ts publishDevices/getDefinitionPayload and lib/model/device.ts exposes() in
// github:Koenkk/zigbee2mqtt):
//   - the definition is found the way zigbee2mqtt finds it, with findByDevice() on a device whose Zigbee model id is
//     the definition's first zigbeeModel (a white label's model name is resolved to its base definition and shown
//     under the white label's model, vendor and description, as findByDevice does for a fingerprint match);
//   - a definition's exposes are either an array or a function of (device, options), which zigbee2mqtt calls with
//     the real herdsman device and the device's options; here it is called with a stub device (one endpoint per
//     endpoint the definition names, else endpoint 1) and empty options;
//   - zigbee2mqtt appends the `linkquality` expose to every device;
//   - the list starts with the coordinator (type Coordinator, no definition), as zigbee2mqtt's does.
//
// Usage: node dump-devices.mjs FRIENDLY_NAME=MODEL [FRIENDLY_NAME=MODEL ...]
//   e.g. node dump-devices.mjs bulb=LED1545G12 plug="SP 120" trv=014G2461
// Each device gets a deterministic ieee address (0x00124b00000000NN, NN its 1-based position).
import {createRequire} from "node:module";
import {readFileSync, readdirSync} from "node:fs";
import {dirname, join} from "node:path";

const require = createRequire(import.meta.url);
const zhc = require("zigbee-herdsman-converters");
zhc.setLogger({debug: () => {}, info: () => {}, warning: () => {}, error: () => {}});

const devicesDir = join(dirname(require.resolve("zigbee-herdsman-converters")), "devices");

// Model name -> {definition (raw, as in the vendor module), whiteLabel (or undefined)}. Scans the vendor modules
// once; a model is looked up by its own name or a white label's.
function findRaw(model) {
    const quoted = JSON.stringify(model);
    for (const file of readdirSync(devicesDir).filter((f) => f.endsWith(".js")).sort()) {
        // Loading every vendor module takes seconds; only those that name the model are loaded.
        if (!readFileSync(join(devicesDir, file), "utf8").includes(quoted)) continue;
        const {definitions} = require(join(devicesDir, file));
        if (!Array.isArray(definitions)) continue;
        for (const definition of definitions) {
            if (definition.model === model) return {definition, whiteLabel: undefined};
            const label = (definition.whiteLabel ?? []).find((w) => w.model === model);
            if (label) return {definition, whiteLabel: label};
        }
    }
    throw new Error(`no definition with model ${JSON.stringify(model)} in zigbee-herdsman-converters`);
}

function stubEndpoint(device, ID) {
    return {
        ID,
        deviceIeeeAddress: device.ieeeAddr,
        deviceNetworkAddress: device.networkAddress,
        inputClusters: [],
        outputClusters: [],
        binds: [],
        configuredReportings: [],
        clusters: {},
        meta: {},
        getDevice: () => device,
        supportsInputCluster: () => false,
        supportsOutputCluster: () => false,
        getInputClusters: () => [],
        getOutputClusters: () => [],
        getClusterAttributeValue: () => undefined,
    };
}

// The herdsman device zigbee2mqtt would hand to findByDevice and exposes(); only what definitions read is here.
function stubDevice(ieeeAddr, networkAddress, modelID, manufacturerName, endpointIds) {
    const device = {
        ieeeAddr,
        networkAddress,
        modelID,
        manufacturerName,
        type: "Router",
        powerSource: "Mains (single phase)",
        softwareBuildID: undefined,
        dateCode: undefined,
        interviewState: "SUCCESSFUL",
        customClusters: {},
        meta: {},
        endpoints: [],
        getEndpoint: (ID) => device.endpoints.find((e) => e.ID === ID),
        isDummyDevice: false,
    };
    device.endpoints = endpointIds.map((ID) => stubEndpoint(device, ID));
    return device;
}

function toJSON(value) {
    // The exposes are class instances; zigbee2mqtt publishes them with JSON.stringify (json-stable-stringify).
    return JSON.parse(JSON.stringify(value));
}

async function deviceEntry(friendlyName, model, position) {
    const {definition: raw, whiteLabel} = findRaw(model);
    const zigbeeModel = raw.zigbeeModel?.[0] ?? raw.fingerprint?.[0]?.modelID ?? model;
    const manufacturerName = raw.fingerprint?.[0]?.manufacturerName ?? raw.vendor;
    const ieeeAddr = `0x00124b00000000${position.toString(16).padStart(2, "0")}`;
    const endpointIds = raw.endpoint ? [...new Set(Object.values(raw.endpoint(stubDevice(ieeeAddr, 0, zigbeeModel, manufacturerName, [1]))))] : [1];
    const device = stubDevice(ieeeAddr, 0x1000 + position, zigbeeModel, manufacturerName, endpointIds.length ? endpointIds : [1]);
    let definition = await zhc.findByDevice(device, false);
    if (!definition) throw new Error(`findByDevice found nothing for ${model} (zigbee model ${zigbeeModel})`);
    if (whiteLabel) {
        definition = {...definition, model: whiteLabel.model, vendor: whiteLabel.vendor ?? definition.vendor, description: whiteLabel.description ?? definition.description};
    }
    const exposes = typeof definition.exposes === "function" ? [...definition.exposes(device, {})] : [...definition.exposes];
    exposes.push(new zhc.Numeric("linkquality", zhc.access.STATE).withUnit("lqi").withDescription("Link quality (signal strength)").withValueMin(0).withValueMax(255).withCategory("diagnostic"));
    return {
        ieee_address: ieeeAddr,
        type: device.type,
        network_address: device.networkAddress,
        supported: true,
        friendly_name: friendlyName,
        disabled: false,
        definition: toJSON({
            source: "native",
            model: definition.model,
            vendor: definition.vendor,
            description: definition.description,
            exposes,
            supports_ota: !!definition.ota,
            options: definition.options ?? [],
        }),
        power_source: device.powerSource,
        model_id: zigbeeModel,
        manufacturer: manufacturerName,
        interviewing: false,
        interview_completed: true,
        interview_state: "SUCCESSFUL",
        endpoints: Object.fromEntries(device.endpoints.map((e) => [e.ID, {bindings: [], configured_reportings: [], clusters: {input: [], output: []}, scenes: []}])),
    };
}

async function main(args) {
    if (!args.length || args.some((a) => !a.includes("="))) {
        process.stderr.write("usage: node dump-devices.mjs FRIENDLY_NAME=MODEL [...]\n");
        process.exit(2);
    }
    const devices = [
        {
            ieee_address: "0x00124b0000000000",
            type: "Coordinator",
            network_address: 0,
            supported: true,
            friendly_name: "Coordinator",
            disabled: false,
            definition: null,
            power_source: "Mains (single phase)",
            interviewing: false,
            interview_completed: true,
            interview_state: "SUCCESSFUL",
            endpoints: {},
        },
    ];
    let position = 1;
    for (const arg of args) {
        const at = arg.indexOf("=");
        devices.push(await deviceEntry(arg.slice(0, at), arg.slice(at + 1), position++));
    }
    process.stdout.write(`${JSON.stringify(devices)}\n`);
}

main(process.argv.slice(2)).catch((error) => {
    process.stderr.write(`${error.stack ?? error}\n`);
    process.exit(1);
});
